"""Simulation lab: simulated clients, interaction states, curriculum, external judge, runner.

Everything here is headless and database-free; the webapp stores what it returns.
"""

from counselor_engine.simulation.ablation import Ablation
from counselor_engine.simulation.curriculum import CurriculumConfig, CurriculumController
from counselor_engine.simulation.external_judge import (
    ExternalJudge,
    ExternalReport,
    PerspectiveScore,
)
from counselor_engine.simulation.interaction import ALL_STATES, InteractionState, state_from_key
from counselor_engine.simulation.profiles import SimProfile, builtin_profiles, import_psychagent
from counselor_engine.simulation.runner import (
    CourseResult,
    SimSession,
    run_course,
    run_courses,
    summarize,
)
from counselor_engine.simulation.simulator import SimulatedClient, SimulatedTurn

__all__ = [
    "ALL_STATES",
    "Ablation",
    "CourseResult",
    "CurriculumConfig",
    "CurriculumController",
    "ExternalJudge",
    "ExternalReport",
    "InteractionState",
    "PerspectiveScore",
    "SimProfile",
    "SimSession",
    "SimulatedClient",
    "SimulatedTurn",
    "builtin_profiles",
    "import_psychagent",
    "run_course",
    "run_courses",
    "state_from_key",
    "summarize",
]
