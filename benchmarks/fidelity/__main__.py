import sys

from benchmarks.fidelity.run import main

sys.exit(main())
