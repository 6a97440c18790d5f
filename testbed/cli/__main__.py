"""`python -m testbed.cli`: the same command line as `dblp-testbed`."""
from testbed.cli import main

main()
