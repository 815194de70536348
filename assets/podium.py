"""`podium/leaderboard`: the Bradley–Terry leaderboard of Podium's votes, and `podium.preferences`.

Materialized by `podium_votes_sensor` whenever `podium.votes` has a new snapshot (or by hand). It
rebuilds `podium.preferences` from that snapshot (the chosen/rejected pairs SFT and preference data
read) and puts the leaderboard in its metadata as a table.
"""

from dagster import AssetExecutionContext, MaterializeResult, asset

from assets._metadata import display, table
from factory.deploy.kube.placement import op_tags
from factory.podium.ratings import leaderboard
from factory.podium.store import VOTES, build_preferences, read_votes
from resources.lake import LakeResource


@asset(key=["podium", "leaderboard"], group_name="podium", kinds={"iceberg"},
       description="Bradley–Terry scores of the exports from Podium's battle votes (bootstrap 95 % intervals), and "
                   "podium.preferences rebuilt from the same votes snapshot.",
       op_tags=op_tags("mix"))  # a small CPU job: the mix kind's pool and limits
def podium_leaderboard(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    lake = lake.lake()
    snapshot = lake.current_snapshot_id(VOTES) if lake.has_table(VOTES) else None
    votes = read_votes(lake, snapshot)
    board = leaderboard([(v["export_a"], v["export_b"], v["vote"]) for v in votes], bootstrap=200, seed=0)
    preferences = build_preferences(lake, run_id=context.run_id)
    context.log.info(f"{len(votes)} votes over {len(board.ratings)} exports; preferences {preferences}")
    rows = [{"rank": i + 1, "export": r.export_id, "score": r.score, "lower": r.lower, "upper": r.upper,
             "votes": r.votes, "wins": r.wins, "losses": r.losses, "ties": r.ties} for i, r in enumerate(board.ratings)]
    return MaterializeResult(metadata=display({
        "leaderboard": table(rows, ["rank", "export", "score", "lower", "upper", "votes", "wins", "losses", "ties"]),
        "votes": len(votes), "votes_snapshot": snapshot or 0, "preferences": preferences or "",
        "leader": board.ratings[0].export_id if board.ratings else "",
    }, first=["leaderboard"]))
