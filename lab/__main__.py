"""`python -m lab <command>`: the lab's commands (and the installed `rift-hf` ones)."""

from lab.cli import main

main()
