"""``python -m hybrid``: the same command line as the ``pyasc`` script (:func:`hybrid.cli.main.main`)."""

from hybrid.cli.main import main

main()
