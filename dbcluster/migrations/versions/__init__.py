"""One revision per file, ``r<NNNN>_<what>.py``, each with ``revision``, ``down_revision`` and
``upgrade(op)`` (as Alembic's ``versions/``); the runner orders them by those links."""
