"""Errors the report shows its user as one line, and the texts for missing dependencies."""

from __future__ import annotations

SPARK_MISSING = (
    "purgatory-report needs PySpark, pyarrow and matplotlib: reinstall its distribution "
    "with its dependencies (pip install ./report from a clone: purgatory-aio-report)"
)

JAVA_MISSING = (
    "Java not found (no JAVA_HOME, no java on PATH): Spark needs a Java runtime; "
    "install Java 17, e.g. apt-get install openjdk-17-jre-headless, or set JAVA_HOME"
)


class ReportError(Exception):
    """Bad input or environment: the message is complete and fits on one line."""


def missing_dependency(exc: ImportError) -> ImportError:
    """The ImportError to raise when an optional analytics dependency is absent."""
    error = ImportError(f"{SPARK_MISSING} (missing module: {exc.name})", name=exc.name)
    error.__cause__ = exc
    return error


def describe_spark_error(exc: BaseException) -> str:
    """Summarise a PySpark or Java exception as one line, without the JVM stack trace.

    Args:
        exc: A ``pyspark.errors`` exception, a ``py4j`` ``Py4JJavaError``, or anything else.

    Returns:
        The first line of the exception's message, followed by the first line of
        the deepest Java cause when that says something more.
    """
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    if java is None:
        getter = getattr(exc, "getMessage", None)
        message = getter() if callable(getter) else str(exc)
        return _first_line(str(message)) or type(exc).__name__
    try:
        head = _first_line(str(java.getMessage() or java.toString()))
        root = java
        seen = 0
        while root.getCause() is not None and seen < 20:
            root = root.getCause()
            seen += 1
        tail = _first_line(str(root.getMessage() or root.toString())) if seen else ""
    except Exception:  # a dead gateway cannot describe its own exceptions
        return _first_line(str(exc)) or type(exc).__name__
    if tail and tail not in head:
        return f"{head} (cause: {tail})"
    return head


def _first_line(text: str, limit: int = 400) -> str:
    for line in text.strip().splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""
