"""The emulated fabric: capabilities, Mininet lifecycle, checks and clean-up."""
