"""``python -m dbcluster.cli``: the ``dbcluster`` command (how the product and the tests start
worker and master processes)."""

from dbcluster.cli.main import main

main()
