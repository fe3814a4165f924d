"""Stub of the compiled build's ``_threadid`` extension (``_threadid.c``)."""

def get_ident() -> int:
    """threading.get_ident(), as the same int object while the same thread asks again."""
