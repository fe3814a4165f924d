"""The simulator: workload, faults, time driving and the report, on top of the broker model."""

from .config import ACKS_CHOICES as ACKS_CHOICES
from .config import FAULTS as FAULTS
from .config import SimConfig as SimConfig
from .report import Report as Report
from .simulation import Simulation as Simulation
from .simulation import run_simulation as run_simulation

__all__ = ["ACKS_CHOICES", "FAULTS", "Report", "SimConfig", "Simulation", "run_simulation"]
