"""Discrete-event cluster simulator: the real engines, llumlets and global scheduler
in virtual time, with a latency model in place of the GPU and a bandwidth model in
place of the KV transport.

Entry points: ``runner.main_simulate`` (the `llumnix simulate` command),
``simulator.Simulator`` (one run), ``calibration_report.calibration_report``.
"""
