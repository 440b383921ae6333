"""``python -m plunder`` runs the command line."""

from plunder.cli import main

main()
