"""The posterior inspector's numbers: past posterior states, rankings, diffs, disagreement.

A client's posterior after session k is the replay of the stored Eq. 4 updates up to k:
each cell ends at the ``mean_after`` / ``precision_after`` of its last update from a
session that ended no later than k, and a cell never updated stays at the prior (mean 0,
precision 4, ``counselor_engine.hbsp``). The shared table Q never changes, so the
selection score of a skill is Q(s, a) + posterior mean, as in the paper's Figure 6.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from django.db.models import Max, QuerySet

from counselor_engine.hbsp import PRIOR_MEAN, PRIOR_PRECISION
from counselor_engine.skills import PriorTable, skills_for
from counselor_engine.states import ALL_SLOTS
from webapp.accounts.models import ClientProfile, User
from webapp.counseling.models import Session
from webapp.learning.models import PosteriorCell, PosteriorUpdate
from webapp.lib import plots
from webapp.oversight.evidence import EvidenceNote, client_notes

TIE_TOLERANCE = 1e-12  # maxima this close are a tie (paper, App. F)
SLOT_INDEX = {slot: i for i, slot in enumerate(ALL_SLOTS)}


@dataclass(frozen=True)
class Checkpoint:
    """A point in a client's history: the prior (``session`` None) or after a session."""

    key: str  # "start" or the session id, as used in the page's query string
    label: str
    session: Session | None
    short: str = "prior"  # for plot titles


@dataclass(frozen=True)
class Snapshot:
    """A posterior state of one client: arrays of shape (54 slots, skills)."""

    checkpoint: Checkpoint
    skills: list[str]
    q: np.ndarray
    mean: np.ndarray
    precision: np.ndarray
    n: np.ndarray

    @property
    def scores(self) -> np.ndarray:
        return self.q + self.mean

    @property
    def sd(self) -> np.ndarray:
        return 1.0 / np.sqrt(self.precision)

    @property
    def top(self) -> list[int | None]:
        return top_skills(self.scores)


def skill_ids(modality: str) -> list[str]:
    return [s.id for s in skills_for(modality)]


def q_matrix(modality: str) -> np.ndarray:
    table = PriorTable.load_default()
    skills = skill_ids(modality)
    return np.array([table.values(modality, slot, skills) for slot in ALL_SLOTS])


def top_skills(scores: np.ndarray) -> list[int | None]:
    """Per row, the column of the maximum, or None when the maximum is tied."""
    out: list[int | None] = []
    for row in scores:
        best = row.max()
        winners = np.flatnonzero(np.abs(row - best) <= TIE_TOLERANCE)
        out.append(int(winners[0]) if winners.size == 1 else None)
    return out


def average_ranks(scores: np.ndarray) -> np.ndarray:
    """Within-row ranks, 1 = highest score; tied skills share their average rank."""
    ranks = np.zeros_like(scores, dtype=float)
    for r, row in enumerate(scores):
        order = sorted(range(row.size), key=lambda c: -row[c])
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and abs(row[order[j + 1]] - row[order[i]]) <= TIE_TOLERANCE:
                j += 1
            for k in range(i, j + 1):
                ranks[r, order[k]] = (i + j) / 2 + 1
            i = j + 1
    return ranks


def rank_change(before: Snapshot, after: Snapshot) -> np.ndarray:
    """Fig. 6 right: initial rank minus final rank (positive: the skill gained priority)."""
    return average_ranks(before.scores) - average_ranks(after.scores)


def modality_of(client: User) -> str:
    profile = ClientProfile.objects.filter(user=client).first()
    if profile is not None:
        return profile.modality
    cell = PosteriorCell.objects.filter(client=client).first()
    return cell.modality if cell else "cbt"


def _version(updates: QuerySet[PosteriorUpdate]) -> str:
    """The newest update's id and time: ids alone repeat when a database is recreated
    (tests, a reset development database) while the cache lives on."""
    last = updates.order_by("-id").values_list("id", "created_at").first()
    return "0" if last is None else f"{last[0]}@{last[1].timestamp():.6f}"


def data_version(client: User) -> str:
    """Changes whenever the client's posterior does: names the newest update."""
    return _version(PosteriorUpdate.objects.filter(cell__client=client))


def checkpoints(client: User) -> list[Checkpoint]:
    sessions = Session.objects.filter(client=client, status=Session.Status.ENDED).order_by(
        "ended_at", "id"
    )
    points = [Checkpoint("start", "Before the first session (prior)", None)]
    for number, session in enumerate(sessions, start=1):
        points.append(
            Checkpoint(
                str(session.pk),
                f"After session {number} ({session.ended_at:%Y-%m-%d %H:%M})",
                session,
                f"after session {number}",
            )
        )
    return points


def find_checkpoint(points: list[Checkpoint], key: str | None, default: int) -> Checkpoint:
    for point in points:
        if point.key == key:
            return point
    return points[default]


def snapshot(client: User, modality: str, point: Checkpoint) -> Snapshot:
    """Replay the client's updates up to ``point`` (see the module docstring)."""
    skills = skill_ids(modality)
    column = {s: i for i, s in enumerate(skills)}
    shape = (len(ALL_SLOTS), len(skills))
    mean = np.full(shape, PRIOR_MEAN, dtype=float)
    precision = np.full(shape, PRIOR_PRECISION, dtype=float)
    n = np.zeros(shape, dtype=int)
    if point.session is not None:
        updates = (
            PosteriorUpdate.objects.filter(
                cell__client=client,
                cell__skill__in=skills,
                session__status=Session.Status.ENDED,
                session__ended_at__lte=point.session.ended_at,
            )
            .order_by("session__ended_at", "session_id", "id")
            .values_list("cell__state_slot", "cell__skill", "mean_after", "precision_after")
        )
        for slot, skill, m, p in updates:
            if slot in SLOT_INDEX:
                r, c = SLOT_INDEX[slot], column[skill]
                mean[r, c], precision[r, c] = m, p
                n[r, c] += 1
    return Snapshot(point, skills, q_matrix(modality), mean, precision, n)


def cell_history(client: User, slot: str, skill: str) -> list[PosteriorUpdate]:
    return list(
        PosteriorUpdate.objects.filter(
            cell__client=client, cell__state_slot=slot, cell__skill=skill
        )
        .select_related("session", "turn")
        .order_by("session__ended_at", "id")
    )


# -- population (paper Figure 3) ---------------------------------------------------------
@dataclass(frozen=True)
class Population:
    modality: str
    clients: list[User]
    tops: np.ndarray  # (clients, 54): skill column, -1 for a tie
    pairs: list[tuple[User, User, float]]

    @property
    def fractions(self) -> list[float]:
        return [f for _, _, f in self.pairs]

    def quartiles(self) -> tuple[float, float, float] | None:
        if not self.pairs:
            return None
        q1, median, q3 = np.percentile(np.array(self.fractions), [25, 50, 75])
        return float(q1), float(median), float(q3)


def disagreement(a: np.ndarray, b: np.ndarray) -> float | None:
    """Share of slots where two clients' top skills differ; a slot tied for either
    client leaves the denominator (App. F). None when no slot is untied for both."""
    both = (a >= 0) & (b >= 0)
    if not both.any():
        return None
    return float(np.mean(a[both] != b[both]))


def population(modality: str, limit: int = 40) -> Population:
    """Clients of ``modality`` with at least one posterior update (the most recently
    updated ``limit`` of them), their top skills per slot, and every pair's disagreement."""
    skills = skill_ids(modality)
    column = {s: i for i, s in enumerate(skills)}
    ids = list(
        PosteriorCell.objects.filter(
            modality=modality,
            client__client_profile__modality=modality,
            client__client_profile__simulated=False,  # the lab's clients are not a population
            n__gt=0,
        )
        .values("client_id")
        .annotate(last=Max("updated_at"))
        .order_by("-last")
        .values_list("client_id", flat=True)[:limit]
    )
    clients = sorted(User.objects.filter(pk__in=ids), key=lambda u: u.username)
    q = q_matrix(modality)
    means = {c.pk: np.zeros_like(q) for c in clients}
    for client_id, slot, skill, m in PosteriorCell.objects.filter(
        client_id__in=ids, skill__in=skills
    ).values_list("client_id", "state_slot", "skill", "mean"):
        if slot in SLOT_INDEX:
            means[client_id][SLOT_INDEX[slot], column[skill]] = m
    tops = np.array(
        [[-1 if t is None else t for t in top_skills(q + means[c.pk])] for c in clients],
        dtype=int,
    ).reshape(len(clients), len(ALL_SLOTS))
    pairs = []
    for i in range(len(clients)):
        for j in range(i + 1, len(clients)):
            value = disagreement(tops[i], tops[j])
            if value is not None:
                pairs.append((clients[i], clients[j], value))
    return Population(modality, clients, tops, pairs)


def population_version(modality: str) -> tuple[str, int]:
    profiles = ClientProfile.objects.filter(modality=modality).count()
    return _version(PosteriorUpdate.objects.filter(cell__modality=modality)), profiles


# -- the inspector page ------------------------------------------------------------------
@dataclass(frozen=True)
class ValueCell:
    skill: str
    q: float
    mean: float
    sd: float
    n: int
    top: bool

    @property
    def score(self) -> float:
        return self.q + self.mean


@dataclass(frozen=True)
class SlotRow:
    slot: str
    stage: str
    label: str
    top_before: str
    top_after: str
    cells: list[ValueCell]

    @property
    def changed(self) -> bool:
        return self.top_before != self.top_after


@dataclass(frozen=True)
class Inspection:
    modality: str
    points: list[Checkpoint]
    before: Snapshot
    after: Snapshot
    rows: list[SlotRow]
    heatmap_after: plots.Plot
    heatmap_before: plots.Plot | None
    diff: plots.Plot | None
    evidence: list[EvidenceNote] = field(default_factory=list)  # per session: did it update?

    @property
    def changed(self) -> int:
        return sum(row.changed for row in self.rows)

    @property
    def updated_cells(self) -> int:
        return int((self.after.n > 0).sum())


def _top_name(skills: list[str], top: int | None) -> str:
    return "tie" if top is None else skills[top]


def inspect(client: User, before_key: str | None, after_key: str | None) -> Inspection:
    """Two snapshots (default: the prior and the latest state), their heatmaps, the
    Fig. 6 rank diff and a row per slot; plots cached per data version."""
    modality = modality_of(client)
    points = checkpoints(client)
    before = snapshot(client, modality, find_checkpoint(points, before_key, 0))
    after = snapshot(client, modality, find_checkpoint(points, after_key, -1))
    version = data_version(client)
    skills = after.skills
    rows = []
    top_b, top_a = before.top, after.top
    for r, slot in enumerate(ALL_SLOTS):
        stage, progress, affect = slot.split("/")
        cells = [
            ValueCell(s, float(after.q[r, c]), float(after.mean[r, c]), float(after.sd[r, c]),
                      int(after.n[r, c]), top_a[r] == c)
            for c, s in enumerate(skills)
        ]  # fmt: skip
        rows.append(
            SlotRow(slot, stage, f"{progress} / {affect}", _top_name(skills, top_b[r]),
                    _top_name(skills, top_a[r]), cells)
        )  # fmt: skip

    def heat(snap: Snapshot) -> plots.Plot:
        svg = plots.cached_svg(
            ("heatmap", client.pk, version, snap.checkpoint.key),
            lambda: plots.heatmap(
                snap.scores, ALL_SLOTS, skills, snap.top, f"Q + mean, {snap.checkpoint.short}"
            ),
        )
        return plots.as_plot(svg, f"Heatmap of Q + posterior mean, {snap.checkpoint.label}")

    same = before.checkpoint.key == after.checkpoint.key
    diff = None
    if not same:
        svg = plots.cached_svg(
            ("rankdiff", client.pk, version, before.checkpoint.key, after.checkpoint.key),
            lambda: plots.rank_diff(
                rank_change(before, after),
                ALL_SLOTS,
                skills,
                f"Rank change, {before.checkpoint.short} → {after.checkpoint.short}",
            ),
        )
        diff = plots.as_plot(svg, "Rank change per slot and skill; the table lists the slots")
    return Inspection(
        modality, points, before, after, rows, heat(after), None if same else heat(before), diff,
        client_notes(client),
    )  # fmt: skip


def population_plot(pop: Population) -> plots.Plot | None:
    if not pop.clients:
        return None
    svg = plots.cached_svg(
        ("population", pop.modality, *population_version(pop.modality), len(pop.clients)),
        lambda: plots.disagreement(
            pop.tops,
            [c.username for c in pop.clients],
            pop.fractions,
            pop.modality,
            skill_ids(pop.modality),
        ),
    )
    return plots.as_plot(svg, f"Top-ranked skills and pairwise disagreement, {pop.modality}")
