"""Change points of the history DB's timing series, found once and kept with their triage.

Each analysis of a run looks at its series' recent history (``changepoints.find``) and matches
what it finds with the change points stored for the series: one found again (the same
direction, within MATCH_RUNS runs of where it was first found, which it keeps, and not found
back when only slow runs showed it) is the same change, its figures refreshed;
one found for the first time is new, and only a new one becomes a finding of the run (so a
step is reported once, by the run that confirmed it, and not again every night after). A stored
one the analysis no longer finds, though its runs are in view, is "withdrawn"; found again, it
is "open" once more. Found again at the same run as a different change (its level settled
after slow runs), it takes over the stored one's acknowledged or expected mark.

A slower change point that the series later leaves again for its old level (a new faster
change point ending at most RETURN_SHARE of the step above the old level, and less than the
regression threshold) is marked "fixed" by the harness itself. One it comes back from only
partway, still the threshold or more above the old level, stays open (``partly_back``); if its
user had marked it invalid (noise), what is left is a regression all the same, and the mark
is lifted.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.history.changepoints import ChangePoint, find, moved
from harness.history.outlier import Outlier, newest_outlier

#: a change point found again this many runs or fewer from where it was is the same one
MATCH_RUNS = 3
#: back to the old level: at most this share of a step left above the level before it
RETURN_SHARE = 0.25
#: triage marks that the harness may replace with "fixed" when the series returns
_STILL_OPEN = (None, "acknowledged")
#: triage marks a change found again at the same run takes over (``carried_triage``)
CARRIED_TRIAGE = ("acknowledged", "expected")
#: who a carried mark is by, and who lifts an invalid mark (``partly_back``)
CARRIED_BY = "harness"
#: the note of a mark lifted by a run (``reopened``)
REOPENED = "reopened by run {run}"


@dataclass
class Reconciled:
    """What one analysis of a series changes in its stored change points."""

    #: found for the first time (or found by this same run before: a re-analysis)
    new: list[ChangePoint] = field(default_factory=list)
    #: stored id -> the change point found again (its figures and position may have moved)
    matched: dict[int, ChangePoint] = field(default_factory=dict)
    #: stored ids, mine by ``new`` index, that this run found before (a re-analysis)
    refound: dict[int, int] = field(default_factory=dict)
    #: stored ids in view but not found again
    withdrawn: list[int] = field(default_factory=list)


def reconcile(stored: Sequence[dict[str, Any]], found: Sequence[ChangePoint],
              run_ids: Sequence[str], analysed_run: str, analysed_started_at: float,
              min_size: int = 2) -> Reconciled:
    """Match ``found`` (indices into ``run_ids``, the series' runs in view, oldest first)
    with the series' ``stored`` change points (``triage.series_change_points``).

    Stored change points found by runs that started after the analysed one are left out: a
    run ingested late must not take credit for, or hide, what later runs already reported.
    """
    position = {run_id: i for i, run_id in enumerate(run_ids)}
    known = [s for s in stored
             if (s.get("found_started_at") or 0.0) <= analysed_started_at
             and s["found_in_run"] != analysed_run]
    own = [s for s in stored if s["found_in_run"] == analysed_run]
    out = Reconciled()
    taken: set[int] = set()
    for cp in found:
        match = _nearest(known, cp, position, taken)
        if match is not None:
            taken.add(match["id"])
            out.matched[match["id"]] = cp
            continue
        mine = _nearest(own, cp, position, taken)
        if mine is not None:
            taken.add(mine["id"])
            out.refound[mine["id"]] = len(out.new)
        out.new.append(cp)
    for s in known:
        pos = position.get(s["run_id"])
        if (s["id"] not in taken and s["state"] == "open" and pos is not None
                and pos >= min_size):
            out.withdrawn.append(s["id"])
    return out


def _nearest(candidates: Sequence[dict[str, Any]], cp: ChangePoint, position: dict[str, int],
             taken: set[int]) -> dict[str, Any] | None:
    """The stored change point ``cp`` is: the same direction, not a report of the excursion
    before ``cp``'s level (``_reported_an_excursion``), and the nearest within MATCH_RUNS runs
    of where it was first found (within one run for a withdrawn one: it is coming back, not a
    new step nearby)."""
    best, best_distance = None, MATCH_RUNS + 1
    for s in candidates:
        pos = position.get(s["run_id"])
        if s["id"] in taken or pos is None or s["direction"] != cp.direction:
            continue
        if _reported_an_excursion(s, cp, position):
            continue
        reach = MATCH_RUNS if s["state"] == "open" else 1
        # how far from its range (where it may have begun)
        distance = max(cp.first_possible - pos, pos - cp.last_possible, 0)
        if distance <= reach and distance < best_distance:
            best, best_distance = s, distance
    return best


def _reported_an_excursion(stored: dict[str, Any], cp: ChangePoint,
                           position: dict[str, int]) -> bool:
    """Whether ``stored`` was found before the first run of ``cp``'s level that is not an
    excursion (``ChangePoint.settled``): it then rested on slow runs alone, and ``cp`` is a
    different change, not it refreshed. Two slow runs reported as a +80% step, then a +10%
    step found at the same place once the runs after them came: were it matched, the step
    would never be reported. A step whose first runs were slow, reported once its level
    showed, is still the same one."""
    found = position.get(stored.get("found_in_run"))
    return cp.settled is not None and found is not None and found < cp.settled


def carried_triage(stored: Sequence[dict[str, Any]], run_id: str, direction: str,
                   matched: Collection[int] = ()) -> dict[str, Any] | None:
    """The triage a new change point at ``run_id`` takes over from a stored one at the same
    run and direction that this analysis did not find again (``matched``: the ids it did):
    one reported while only slow runs showed it, and marked acknowledged or expected, is the
    same change to its user; the level found after the slow runs is not reported again. One
    marked invalid (noise, said its user) hands nothing on: the level found after it is news."""
    for s in stored:
        if (s["run_id"] == run_id and s["direction"] == direction and s["id"] not in matched
                and s.get("triage") in CARRIED_TRIAGE):
            note = f"carried from change point {s['id']} at the same run ({s['triage']}"
            note += f": {s['triage_note']})" if s.get("triage_note") else ")"
            return {"triage": s["triage"], "triage_note": note, "triage_by": CARRIED_BY}
    return None


def _carried(stored: dict[str, Any]) -> bool:
    """Whether ``stored`` holds a mark it took over (``carried_triage``): it stands for a report
    its user has seen and marked, so it is not reported when it grows. A user's own mark on a
    change never reported does not count: that change, grown, is reported once (a mark given
    to +4% must not silence +20%)."""
    return stored.get("triage_by") == CARRIED_BY and stored.get("triage") in CARRIED_TRIAGE


def returned(stored: Sequence[dict[str, Any]], recovery: ChangePoint,
             threshold_pct: float, position: dict[str, int],
             analysed_started_at: float) -> list[dict[str, Any]]:
    """The stored slower change points that a new faster one (``recovery``) takes the series
    back from: still open or only acknowledged, and ``recovery.after`` at most RETURN_SHARE of
    their step above the level before them and less than ``threshold_pct`` percent above it
    (a +40% step back to +8% is not fixed: +8% is a regression by the harness's own bar).
    Only steps before it: ``position`` (run id -> index in the analysed runs) places those in
    view, and one found by a run that started after the analysed one (``analysed_started_at``)
    is a later step (a run ingested late is analysed again with the runs after it: a -3% drift
    found then took back a 2x step that came later and stays)."""
    if recovery.direction != "down":
        return []
    return [s for s in stored
            if s["direction"] == "up" and s.get("triage") in _STILL_OPEN
            and isinstance(s.get("before"), float) and isinstance(s.get("after"), float)
            and position.get(s["run_id"], -1) < recovery.first_possible
            and (s.get("found_started_at") or 0.0) <= analysed_started_at
            and _takes_back(s["before"], s["after"], recovery, threshold_pct)]


def _takes_back(before: float, after: float, recovery: ChangePoint,
                threshold_pct: float) -> bool:
    """Whether ``recovery`` (faster) ends a step from ``before`` to ``after``: back to at most
    RETURN_SHARE of the step above ``before``, and less than ``threshold_pct`` above it."""
    return (recovery.direction == "down"
            and recovery.after <= before + RETURN_SHARE * (after - before)
            and _left_pct(before, recovery.after) < threshold_pct)


def already_over(found: Sequence[ChangePoint], new: Sequence[ChangePoint],
                 threshold_pct: float) -> list[int]:
    """Indices into ``new`` of the slower change points that the next change point ``found``
    (all of this analysis', oldest first) already takes back to the level before them
    (``returned``'s test), and of that return where it is new too: a slow stretch that had
    ended when the analysis first found it (two slow runs split off in a longer view).
    Nothing is left to act on: reported, it would fail tonight's run for a change that is
    over, and stored, it would stay an open regression that no later return marks fixed.
    Found over again each night, it is passed over again; should its return go (the level
    stays), it is new and reported then."""
    out: set[int] = set()
    where = {id(cp): i for i, cp in enumerate(new)}
    for at, cp in enumerate(found[:-1]):
        if (id(cp) in where and cp.direction == "up"
                and _takes_back(cp.before, cp.after, found[at + 1], threshold_pct)):
            out.add(where[id(cp)])
            if id(found[at + 1]) in where:
                out.add(where[id(found[at + 1])])
    return sorted(out)


def _left_pct(before: float, now: float) -> float:
    return 100.0 * (now - before) / abs(before) if before else math.inf


def partly_back(stored: Sequence[dict[str, Any]], recovery: ChangePoint,
                position: dict[str, int], threshold_pct: float
                ) -> tuple[dict[str, Any], float] | None:
    """The stored slower change point that a new faster one (``recovery``) takes the series
    only partway back from, and what is left of it in percent of the level before it: the
    nearest open one before ``recovery`` (``position``: run id -> index in the analysed
    runs), which the series was still at least halfway up when it came down, with
    ``recovery.after`` still ``threshold_pct`` percent or more above the level before it. A
    slow stretch of four runs reported at +40%, then the series settles at +8%: the +8% is
    the regression that stays."""
    if recovery.direction != "down":
        return None
    best = None
    for s in stored:
        before, after, pos = s.get("before"), s.get("after"), position.get(s["run_id"])
        if (s["direction"] != "up" or s.get("state") != "open" or s.get("triage") == "fixed"
                or pos is None
                or pos >= recovery.index or not isinstance(before, float)
                or not isinstance(after, float)):
            continue
        if (best is None or pos > best[0]) and recovery.before >= before + (after - before) / 2:
            best = (pos, s)
    if best is None:
        return None
    s = best[1]
    left = _left_pct(s["before"], recovery.after)
    return (s, left) if left >= threshold_pct else None


def reopened(stored: dict[str, Any], run_id: str) -> bool:
    """Whether ``stored``'s invalid mark was lifted by run ``run_id`` (``partly_back``): so that
    the run, analysed again, says again what it said."""
    return (stored.get("triage") is None and stored.get("triage_by") == CARRIED_BY
            and (stored.get("triage_note") or "").startswith(REOPENED.format(run=run_id)))


@dataclass
class SeriesVerdict:
    """One analysis of a series at its newest run."""

    found: list[ChangePoint]
    reconciled: Reconciled
    #: the newest run alone off the current level (None when it confirmed a new level)
    outlier: Outlier | None
    #: stored ids of matched change points that reach the threshold now and were never
    #: reported by an earlier run (found small, they grew: reported once, now), nor took over
    #: a mark (``carried_triage``)
    grown: list[int] = field(default_factory=list)
    #: indices into ``reconciled.new`` of slower change points already over when found, and
    #: of their returns (``already_over``): neither stored nor reported
    over: list[int] = field(default_factory=list)


def judge_series(runs: Sequence[Sequence[float] | float], run_ids: Sequence[str],
                 stored: Sequence[dict[str, Any]], analysed_started_at: float, *,
                 min_change_pct: float, threshold_pct: float,
                 log: bool = False, quantile: float = 0.5) -> SeriesVerdict:
    """The analysis of a series at its newest run (``runs`` and ``run_ids`` oldest first, the
    analysed run last): its change points (``find``, at least ``min_change_pct``), matched with
    the ``stored`` ones, and whether the newest run alone left the level by ``threshold_pct``
    or more (``log``: in the logs of the values, as for timings; ``quantile``: each run with
    samples analysed by this quantile of them). The one rule ``harness run`` applies and
    benchmarks/regression_detection.py replays."""
    found = find(runs, min_change_pct=min_change_pct, log=log, quantile=quantile)
    rec = reconcile(stored, found, run_ids, run_ids[-1], analysed_started_at)
    # a change point that may have begun at the previous run was confirmed by the newest: it
    # is no outlier (nor is the newest run, where it is the first of the new level)
    confirmed = any(cp.first_possible >= len(runs) - 2 for cp in found)
    # and against the level since the last change point found now, where that is later than
    # what the runs before the newest show: a step found tonight whose new level holds the
    # newest run is not also a suspicious run off the old level
    since = max((cp.index for cp in found if cp.index < len(runs) - 1), default=None)
    outlier = None if confirmed else newest_outlier(runs, min_change_pct=threshold_pct,
                                                          log=log, quantile=quantile,
                                                          since=since)
    by_id = {s["id"]: s for s in stored}
    grown = [cp_id for cp_id, cp in rec.matched.items()
             if moved(cp.before, cp.after, threshold_pct)
             and not _carried(by_id[cp_id])
             and not (by_id[cp_id].get("reported_at") is not None
                      and by_id[cp_id]["reported_at"] < analysed_started_at)]
    return SeriesVerdict(found, rec, outlier, grown, already_over(found, rec.new, threshold_pct))
