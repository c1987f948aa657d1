"""``python -m msgsafe ...`` runs the ``msgsafe`` command."""

from msgsafe.cli import main

if __name__ == "__main__":
    main()
