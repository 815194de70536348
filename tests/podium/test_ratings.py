"""The Bradley–Terry fit (factory.podium.ratings) on simulated votes of known strengths."""

import numpy as np
import pytest

from factory.podium.ratings import leaderboard

TRUE = {"export/a@1": 1200.0, "export/b@1": 1050.0, "export/c@1": 950.0, "export/d@1": 800.0}  # mean 1000


def simulate(n: int, seed: int, tie_rate: float = 0.1) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    names = list(TRUE)
    votes = []
    for _ in range(n):
        a, b = rng.choice(len(names), 2, replace=False)
        ea, eb = names[a], names[b]
        if rng.random() < tie_rate:
            votes.append((ea, eb, "tie" if rng.random() < 0.5 else "bothbad"))
            continue
        p = 1 / (1 + 10 ** ((TRUE[eb] - TRUE[ea]) / 400))
        votes.append((ea, eb, "a" if rng.random() < p else "b"))
    return votes


@pytest.mark.slow
def test_bradley_terry_recovers_known_strengths_within_their_intervals():
    board = leaderboard(simulate(3000, seed=1, tie_rate=0.0), bootstrap=100, seed=0)  # votes drawn from the model
    assert [r.export_id for r in board.ratings] == list(TRUE)  # the true order
    for r in board.ratings:
        assert r.lower <= TRUE[r.export_id] <= r.upper, (r, TRUE[r.export_id])
        assert r.upper - r.lower < 60  # 3000 votes pin a rating to a few tens of points
    assert board.votes == 3000 == sum(r.votes for r in board.ratings) // 2
    strong, weak = "export/a@1", "export/d@1"
    assert board.win_rate[strong][weak] > 0.8 and board.win_rate[weak][strong] < 0.2
    assert board.win_rate[strong][weak] + board.win_rate[weak][strong] == pytest.approx(1.0)


def test_intervals_narrow_with_votes_and_a_single_vote_stays_finite():
    few, many = leaderboard(simulate(200, seed=2), bootstrap=50), leaderboard(simulate(2000, seed=2), bootstrap=50)
    width = lambda board: np.mean([r.upper - r.lower for r in board.ratings])  # noqa: E731
    assert width(many) < width(few) / 2
    one = leaderboard([("export/a@1", "export/b@1", "a")], bootstrap=20)
    assert one.ratings[0].export_id == "export/a@1" and all(np.isfinite(r.score) for r in one.ratings)
    assert one.win_rate["export/b@1"]["export/a@1"] == 0.0


def test_bad_votes_are_refused_with_the_vote_named():
    with pytest.raises(ValueError, match="outcome must be one of"):
        leaderboard([("export/a@1", "export/b@1", "maybe")])
    with pytest.raises(ValueError, match="two different exports"):
        leaderboard([("export/a@1", "export/a@1", "a")])


def test_leader_pairing_puts_the_least_voted_export_against_the_leader():
    import random

    from factory.podium.app import choose_pair
    from factory.podium.store import PodiumError

    votes = [(a, b, o) for a, b, o in simulate(400, seed=3) if "export/d@1" not in (a, b)]  # d: never voted on
    board = leaderboard(votes, bootstrap=0)
    exports = list(TRUE)
    rng = random.Random(0)
    pairs = [choose_pair(exports, board, rng) for _ in range(20)]
    assert all(set(p) == {"export/a@1", "export/d@1"} for p in pairs)  # the leader meets the newcomer
    assert {p[0] for p in pairs} == {"export/a@1", "export/d@1"}  # in either seat (anonymous sides)
    randoms = {frozenset(choose_pair(exports, None, rng)) for _ in range(200)}
    assert len(randoms) == 6  # random pairing reaches every pair of 4
    with pytest.raises(PodiumError, match="needs two exports"):
        choose_pair(["export/a@1"])
