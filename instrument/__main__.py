"""``python -m instrument``: the ``torch-profiled`` command (see ``instrument.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
