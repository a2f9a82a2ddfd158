"""``python -m gradcode``: the same as the ``gradcode`` command."""

import sys

from gradcode.client.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
