"""`python -m rift_hf.cli ...` is `rift-hf ...`."""

from . import main

main()
