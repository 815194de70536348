"""Podium's tables: conversations and votes, append-only in Iceberg, and the preferences built from them.

- `podium.conversations`: one row per generation a person saw (a chat turn, or one side of a battle),
  with the export's lineage id and content hash, the messages sent, the sampling, the backend and
  the time to first token.
- `podium.votes`: one row per battle vote, with both exports, both responses and the prompt. Each
  commit has a lineage row `podium.votes@<snapshot>` whose upstream is the two exports, so a vote
  leads back to both checkpoints, their mixes and the snapshots those pinned.
- `podium.preferences`: the decisive votes as chosen/rejected pairs, rebuilt in one overwrite from one
  votes snapshot (`build_preferences`); its lineage upstream is that snapshot and every export voted on.

`PodiumStore` keeps what the app checks against (which battles a user saw, which were voted) in
memory, loaded from the tables when it opens and updated under one lock as it appends, so a check
and its append are atomic within the process (run one Podium replica per lake), and a restart
sees every vote committed before it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
from dataclasses import dataclass

import pyarrow as pa

from factory.lake import Lake
from factory.lake.commit import CommitStamp
from factory.lake.lineage import SNAPSHOT, LineageRecord, table_version_id
from factory.lake.schemas import PODIUM_CONVERSATIONS, PODIUM_PREFERENCES, PODIUM_VOTES
from factory.version import canonical_json, env_lock_hash

CONVERSATIONS, VOTES, PREFERENCES = "podium.conversations", "podium.votes", "podium.preferences"
VOTE_CHOICES = ("a", "b", "tie", "bothbad")


class PodiumError(ValueError):
    """A request Podium refuses; `status` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Side:
    export_id: str
    response: str | None = None  # None until its generation was recorded
    checkpoint_id: str = ""
    claimed: bool = False  # a generation of it is running


@dataclass
class Battle:
    battle_id: str
    user: str
    prompt: str
    sampling: dict
    a: Side
    b: Side
    vote: str | None = None


def _stamp(asset_key: str, **config) -> CommitStamp:
    return CommitStamp(asset_key=asset_key, config_hash=hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16])


class PodiumStore:
    """The app's view of the podium tables (module docstring)."""

    def __init__(self, lake: Lake, asset_key: str = "podium"):
        self.lake, self.asset_key = lake, asset_key
        self._lock = threading.Lock()
        lake.ensure_table(CONVERSATIONS, PODIUM_CONVERSATIONS)
        lake.ensure_table(VOTES, PODIUM_VOTES)
        self.battles: dict[str, Battle] = {}
        self._load()

    def _load(self) -> None:
        for row in sorted(self.lake.table(CONVERSATIONS).scan(row_filter="kind == 'battle'").to_arrow().to_pylist(),
                          key=lambda r: r["created_at"]):
            battle = self.battles.get(row["conversation_id"])
            if battle is None:
                battle = self.battles[row["conversation_id"]] = Battle(
                    row["conversation_id"], row["user"], row["prompt"], json.loads(row["sampling"]), Side(""), Side(""))
            side = battle.a if row["side"] == "A" else battle.b
            side.export_id, side.response, side.checkpoint_id = row["export_id"], row["response"], row["checkpoint_id"]
        for row in self.lake.table(VOTES).scan(selected_fields=("battle_id", "vote")).to_arrow().to_pylist():
            if row["battle_id"] in self.battles:
                self.battles[row["battle_id"]].vote = row["vote"]

    # -- battles -------------------------------------------------------------------------------------
    def open_battle(self, battle_id: str, user: str, prompt: str, sampling: dict, export_a: str, export_b: str) -> Battle:
        with self._lock:
            battle = self.battles[battle_id] = Battle(battle_id, user, prompt, sampling, Side(export_a), Side(export_b))
        return battle

    def battle_for(self, battle_id: str, user: str) -> Battle:
        """The battle `battle_id` as `user` saw it, or PodiumError (unknown, or someone else's)."""
        battle = self.battles.get(battle_id)
        if battle is None or battle.user != user:  # someone else's battle is as unknown as a made-up id
            raise PodiumError(f"battle {battle_id!r}: no such battle of user {user!r}", 404)
        return battle

    def claim_side(self, battle: Battle, side: str) -> Side:
        """The battle's side `side`, now marked as being generated; PodiumError when it is or was."""
        with self._lock:
            chosen = battle.a if side == "A" else battle.b
            if chosen.response is not None or chosen.claimed:
                raise PodiumError(f"battle {battle.battle_id}: side {side} was generated already", 409)
            chosen.claimed = True
            return chosen

    def release_side(self, battle: Battle, side: str) -> None:
        with self._lock:
            (battle.a if side == "A" else battle.b).claimed = False

    def vote(self, battle_id: str, user: str, choice: str) -> Battle:
        """Record `user`'s vote on a battle they saw to its end; refuses anything else, changing nothing."""
        if choice not in VOTE_CHOICES:
            raise PodiumError(f"vote {choice!r}: must be one of {', '.join(VOTE_CHOICES)}")
        with self._lock:
            battle = self.battle_for(battle_id, user)
            if battle.vote is not None:
                raise PodiumError(f"battle {battle_id}: already voted ({battle.vote})", 409)
            if battle.a.response is None or battle.b.response is None:
                raise PodiumError(f"battle {battle_id}: both responses must finish before a vote", 409)
            row = {"battle_id": battle_id, "user": user, "vote": choice, "export_a": battle.a.export_id,
                   "export_b": battle.b.export_id, "checkpoint_a": battle.a.checkpoint_id,
                   "checkpoint_b": battle.b.checkpoint_id, "prompt": battle.prompt, "response_a": battle.a.response,
                   "response_b": battle.b.response, "sampling": canonical_json(battle.sampling),
                   "created_at": dt.datetime.now(dt.timezone.utc)}
            upstream = sorted({battle.a.export_id, battle.b.export_id})
            lineage = LineageRecord(
                version_id=table_version_id(VOTES, SNAPSHOT), kind="podium_votes", name=VOTES,
                uri=self.lake.table(VOTES).location(), upstream=upstream, config_json=canonical_json({"battle": battle_id}),
                asset_key=self.asset_key, env_lock=env_lock_hash(),
                metadata_json=canonical_json({"battle_id": battle_id, "vote": choice}))
            self.lake.commit(VOTES, pa.Table.from_pylist([row], schema=PODIUM_VOTES.as_arrow()),
                             _stamp(self.asset_key, table=VOTES), lineage=lineage)
            battle.vote = choice
        return battle

    # -- generations -----------------------------------------------------------------------------------
    def record_generation(self, row: dict, battle: Battle | None = None) -> None:
        """Append one `podium.conversations` row; a battle side is filled in once it is stored."""
        full = {"first_token_ms": None, **row, "created_at": dt.datetime.now(dt.timezone.utc)}
        with self._lock:  # a battle side reaches here once: `claim_side` let one generation of it run
            self.lake.commit(CONVERSATIONS, pa.Table.from_pylist([full], schema=PODIUM_CONVERSATIONS.as_arrow()),
                             _stamp(self.asset_key, table=CONVERSATIONS))
            if battle is not None:
                side = battle.a if row["side"] == "A" else battle.b
                side.response, side.checkpoint_id = row["response"], row["checkpoint_id"]

def read_votes(lake: Lake, snapshot_id: int | None = None) -> list[dict]:
    """Every vote (at `snapshot_id`, default the newest), oldest first; [] before the first."""
    if not lake.has_table(VOTES):
        return []
    table = lake.table(VOTES)
    if table.current_snapshot() is None:
        return []
    return sorted(table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist(), key=lambda r: r["created_at"])


def build_preferences(lake: Lake, *, run_id: str = "", asset_key: str = "podium/preferences") -> str | None:
    """Rebuild `podium.preferences` from the current votes snapshot (a no-op when built from it
    already); its version id `podium.preferences@<snapshot>`, or None before the first vote."""
    if not lake.has_table(VOTES) or (snapshot := lake.table(VOTES).current_snapshot()) is None:
        return None
    lake.ensure_table(PREFERENCES, PODIUM_PREFERENCES)
    table = lake.table(PREFERENCES)
    if table.current_snapshot() is not None:
        built = table.scan(selected_fields=("votes_snapshot",), limit=1).to_arrow()
        previous = lake.lineage.records(kind="podium_preferences")
        if (built.num_rows and built.column(0)[0].as_py() == snapshot.snapshot_id) or \
                (previous and previous[-1].upstream[:1] == [table_version_id(VOTES, snapshot.snapshot_id)]):
            return table_version_id(PREFERENCES, table.current_snapshot().snapshot_id)
    now = dt.datetime.now(dt.timezone.utc)
    rows, votes = [], read_votes(lake, snapshot.snapshot_id)
    voted = {v[f"export_{side}"] for v in votes for side in "ab"}
    for v in votes:
        if v["vote"] not in ("a", "b"):
            continue  # a tie or both-bad says nothing about which answer is better
        win, lose = ("a", "b") if v["vote"] == "a" else ("b", "a")
        rows.append({"battle_id": v["battle_id"], "user": v["user"], "prompt": v["prompt"],
                     "chosen": v[f"response_{win}"], "rejected": v[f"response_{lose}"],
                     "chosen_export": v[f"export_{win}"], "rejected_export": v[f"export_{lose}"],
                     "votes_snapshot": snapshot.snapshot_id, "created_at": now})
    upstream = [table_version_id(VOTES, snapshot.snapshot_id), *sorted(voted)]  # every model voted on, directly
    stamp = _stamp(asset_key, table=PREFERENCES).model_copy(update={"run_id": run_id})
    lineage = LineageRecord(
        version_id=table_version_id(PREFERENCES, SNAPSHOT), kind="podium_preferences", name=PREFERENCES,
        uri=table.location(), upstream=upstream, config_json=canonical_json({"source": VOTES}),
        config_hash=stamp.config_hash, env_lock=env_lock_hash(), asset_key=asset_key, run_id=run_id,
        metadata_json=canonical_json({"pairs": len(rows)}))
    commit = lake.commit(PREFERENCES, pa.Table.from_pylist(rows, schema=PODIUM_PREFERENCES.as_arrow()), stamp,
                         mode="overwrite", lineage=lineage)
    return table_version_id(PREFERENCES, commit.snapshot_id)
