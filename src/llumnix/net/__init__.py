"""What every port we open shares: the gate connections pass before they authenticate."""
