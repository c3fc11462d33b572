"""`python -m shoal` runs the CLI, exactly as the `shoal` script does."""

from shoal.cli import main

main()
