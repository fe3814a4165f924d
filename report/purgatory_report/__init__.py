"""Analytics over the operation event log (PySpark).

Needs the ``spark`` extra (PySpark, pyarrow, matplotlib) and Java 17; nothing
here is imported by the core. Run it as ``purgatory-report EVENTS_DIR --out
REPORT_DIR``, or from Python::

    from purgatory_report.report import run
    from purgatory_report.session import create_session

    report = run("events/", "report/", spark=create_session("local[2]"))

Modules: :mod:`~.inputs` (find, check, read the files), :mod:`~.metrics` (the
Spark aggregations), :mod:`~.report` (a run), :mod:`~.staging` (local JSON Lines
parsed by Arrow), :mod:`~.render` and :mod:`~.charts` (``report.md`` and its PNGs),
:mod:`~.session`, :mod:`~.cli`.
"""
