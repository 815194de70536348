"""The Podium app over HTTP (FastAPI's TestClient, real lake, real exports generating in-process):
bad requests change nothing, CSRF and rate limits, concurrent votes, a restart, the Dagster asset."""

import html
import re
import threading

import pytest
from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context, materialize
from fastapi.testclient import TestClient
from pyiceberg.expressions import EqualTo

from factory.podium.app import create_app
from factory.posttrain.sft.data import build_examples
from factory.podium.store import CONVERSATIONS, PREFERENCES, VOTES
from resources.lake import LakeResource

SHORT = {"max_tokens": 3, "temperature": 0.0}


def rows(lake, table: str) -> int:
    return lake.table(table).scan().to_arrow().num_rows if lake.has_table(table) else 0


class Client:
    """A signed-in user of `app`, with the CSRF token its pages carry."""

    def __init__(self, app, token: str):
        self.http = TestClient(app)
        assert self.http.get(f"/login?token={token}", follow_redirects=False).status_code == 303
        page = self.http.get("/battle")
        assert page.status_code == 200
        self.csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text).group(1)

    def post(self, path: str, body=None, csrf: str | None = None):
        return self.http.post(path, json=body, headers={"X-CSRF-Token": self.csrf if csrf is None else csrf})

    def battle(self, prompt: str = "def add(a, b):") -> str:
        answer = self.post("/api/battle", {"prompt": prompt, "sampling": SHORT})
        assert answer.status_code == 200, answer.text
        battle = answer.json()["battle_id"]
        for side in "AB":
            streamed = self.post(f"/api/battle/{battle}/{side}")
            assert streamed.status_code == 200, streamed.text
        return battle


@pytest.mark.slow
def test_bad_requests_get_a_clear_error_and_change_nothing(podium_lake, podium_config):
    app = create_app(podium_config(), podium_lake)
    alice, bob = Client(app, "tok-alice"), Client(app, "tok-bob")
    export = "export/evalsmoke@8"
    battle = alice.battle()
    before = {t: rows(podium_lake, t) for t in (CONVERSATIONS, VOTES)}
    refused = [
        (TestClient(app).get("/models"), 401, "not signed in"),
        (TestClient(app).get("/login?token=guess"), 401, "unknown token"),
        (alice.post("/api/chat", {"export": export, "messages": [{"role": "user", "content": "hi"}]}, csrf="x"),
         403, "CSRF"),
        (alice.http.post("/api/battle", json={"prompt": "hi"}), 403, "CSRF"),  # no token at all
        (bob.post("/api/chat", {"export": export, "messages": [{"role": "user", "content": "hi"}]}, csrf=alice.csrf),
         403, "CSRF"),  # another user's token
        (alice.post("/api/chat", {"export": "export/nope@1", "messages": [{"role": "user", "content": "hi"}]}),
         404, "export/nope@1"),
        (alice.post("/api/chat", {"export": export, "messages": [{"role": "user", "content": "   "}]}), 400, "empty"),
        (alice.post("/api/chat", {"export": export, "messages": [{"role": "user", "content": "x" * 4001}]}),
         413, "4001 characters"),
        (alice.post("/api/chat", {"export": export, "messages": [{"role": "user", "content": "hi"}],
                                  "sampling": {"max_tokens": 100000}}), 400, "max_tokens"),
        (alice.post("/api/battle", {"prompt": ""}), 400, "empty"),
        (bob.post(f"/api/battle/{battle}/vote", {"vote": "a"}), 404, "no such battle of user 'bob'"),
        (alice.post("/api/battle/made-up/vote", {"vote": "a"}), 404, "no such battle"),
        (alice.post(f"/api/battle/{battle}/vote", {"vote": "maybe"}), 400, "must be one of"),
        (alice.post(f"/api/battle/{battle}/A"), 409, "generated already"),
        (alice.http.get("/datasets/no.such"), 404, "not in the lake"),
        (alice.http.get(f"/datasets/{CONVERSATIONS}?column=nope&value=1"), 400, "column 'nope'"),
        (alice.http.get(f"/datasets/{CONVERSATIONS}?column=turn&value=one"), 400, "turn='one'"),
    ]
    for response, status, says in refused:
        assert response.status_code == status, (response.request.url, response.text)
        assert says in html.unescape(response.text), (says, response.text[:300])
    assert {t: rows(podium_lake, t) for t in (CONVERSATIONS, VOTES)} == before
    # the dataset browser: two filters at once (and-ed), each row as it is in the table
    page = alice.http.get(f"/datasets/{CONVERSATIONS}?column=kind&value=battle&column=side&value=A")
    assert page.status_code == 200 and "where kind = battle and side = A" in html.unescape(page.text)
    shown = re.findall(r"<tr>(.*?)</tr>", page.text.split("<tbody>")[1], re.S)
    want = [r for r in podium_lake.table(CONVERSATIONS).scan().to_arrow().to_pylist()
            if r["kind"] == "battle" and r["side"] == "A"]
    header = re.findall(r"<th>(.*?)</th>", page.text.split("<thead>")[1].split("</thead>")[0])
    cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for row in shown]
    assert 0 < len(shown) == min(len(want), 50) and f"<td>{battle}</td>" in page.text
    assert {(c[header.index("kind")], c[header.index("side")]) for c in cells} == {("battle", "A")}
    odd = alice.http.get(f"/datasets/{CONVERSATIONS}?column=kind&value=battle&column=side")
    assert odd.status_code == 400 and "2 columns but 1 values" in odd.text
    # an unfinished battle cannot be voted on
    unfinished = alice.post("/api/battle", {"prompt": "x = 1", "sampling": SHORT}).json()["battle_id"]
    assert alice.post(f"/api/battle/{unfinished}/vote", {"vote": "a"}).status_code == 409
    # a side being generated (another tab) is not generated twice; once released, it can be
    fight = app.state.store.battle_for(unfinished, "alice")
    app.state.store.claim_side(fight, "A")
    assert alice.post(f"/api/battle/{unfinished}/A").status_code == 409
    app.state.store.release_side(fight, "A")
    assert alice.post(f"/api/battle/{unfinished}/A").status_code == 200 and fight.a.response is not None
    # the vote itself, then a second one
    assert alice.post(f"/api/battle/{battle}/vote", {"vote": "b"}).status_code == 200
    again = alice.post(f"/api/battle/{battle}/vote", {"vote": "a"})
    assert again.status_code == 409 and "already voted (b)" in again.text
    assert rows(podium_lake, VOTES) == before[VOTES] + 1


def test_generation_is_rate_limited_per_user(podium_lake, podium_config):
    app = create_app(podium_config(generations_per_minute=2), podium_lake)
    alice, bob = Client(app, "tok-alice"), Client(app, "tok-bob")
    chat = {"export": "export/evalsmoke@8", "messages": [{"role": "user", "content": "import os"}], "sampling": SHORT}
    assert [alice.post("/api/chat", chat).status_code for _ in range(2)] == [200, 200]
    before = rows(podium_lake, CONVERSATIONS)
    limited = alice.post("/api/chat", chat)
    assert limited.status_code == 429 and "rate limit of 2 generations a minute" in limited.text
    assert alice.post("/api/battle", {"prompt": "x", "sampling": SHORT}).status_code == 429
    assert rows(podium_lake, CONVERSATIONS) == before
    assert bob.post("/api/chat", chat).status_code == 200  # another user's budget is their own


@pytest.mark.slow
def test_concurrent_votes_are_all_stored_and_survive_a_restart(podium_lake, podium_config):
    config = podium_config()
    app = create_app(config, podium_lake)
    clients = [Client(app, t) for t in ("tok-alice", "tok-bob", "tok-carol")]
    battles = [(c, c.battle(f"# battle {i} of {c.http.cookies.get('podium_token')}")) for c in clients for i in range(2)]
    before = rows(podium_lake, VOTES)
    answers = {}

    def vote(client, battle, choice):
        answers[battle] = client.post(f"/api/battle/{battle}/vote", {"vote": choice})

    threads = [threading.Thread(target=vote, args=(c, b, ("a", "b", "tie")[i % 3])) for i, (c, b) in enumerate(battles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a.status_code == 200 for a in answers.values()), [a.text for a in answers.values()]
    votes = {r["battle_id"]: r for r in podium_lake.table(VOTES).scan().to_arrow().to_pylist()}
    assert rows(podium_lake, VOTES) == before + 6 and {b for _, b in battles} <= set(votes)
    for client, battle in battles:
        assert votes[battle]["response_a"] and votes[battle]["export_a"] != votes[battle]["export_b"]

    restarted = create_app(config, podium_lake)  # a new process would read the same tables
    again = Client(restarted, "tok-alice").post(f"/api/battle/{battles[0][1]}/vote", {"vote": "a"})
    assert again.status_code == 409 and "already voted" in again.text
    board = Client(restarted, "tok-bob").http.get("/leaderboard").text
    counts = dict(re.findall(r'data-export="([^"]+)">.*?class="num votes">(\d+)<', board, re.S))
    assert sum(map(int, counts.values())) == 2 * rows(podium_lake, VOTES)


@pytest.mark.slow
def test_the_leaderboard_asset_and_sensor_rebuild_preferences_with_lineage_to_both_checkpoints(
        podium_lake, podium_config, tmp_path):
    from assets.podium import podium_leaderboard
    from sensors.podium import podium_votes_sensor

    app = create_app(podium_config(), podium_lake)
    alice = Client(app, "tok-alice")
    assert alice.post(f"/api/battle/{alice.battle()}/vote", {"vote": "a"}).status_code == 200
    resources = {"lake": LakeResource(home=str(podium_lake.home))}
    instance = DagsterInstance.ephemeral()
    request = podium_votes_sensor(build_sensor_context(instance=instance, resources=resources))
    snapshot = podium_lake.current_snapshot_id(VOTES)
    assert isinstance(request, RunRequest) and request.run_key == f"{VOTES}@{snapshot}"
    skipped = podium_votes_sensor(build_sensor_context(instance=instance, cursor=str(snapshot), resources=resources))
    assert isinstance(skipped, SkipReason)

    result = materialize([podium_leaderboard], resources=resources, instance=instance)
    assert result.success
    metadata = result.asset_materializations_for_node("podium__leaderboard")[0].metadata
    votes = podium_lake.table(VOTES).scan().to_arrow().to_pylist()
    # one row per export in the battles (the shared lake holds two exports, or three once
    # tests/posttrain/test_sft_serve.py has exported its SFT run into it on this worker)
    battled = {v[side] for v in votes for side in ("export_a", "export_b")}
    assert metadata["votes"].value == len(votes) and len(metadata["leaderboard"].records) == len(battled) >= 2
    preferences = podium_lake.table(PREFERENCES).scan().to_arrow().to_pylist()
    assert len(preferences) == sum(v["vote"] in ("a", "b") for v in votes)
    assert {p["votes_snapshot"] for p in preferences} == {snapshot}
    mine = next(p for p in preferences if p["user"] == "alice" and p["battle_id"] in {v["battle_id"] for v in votes})
    assert mine["chosen"] != mine["rejected"] or mine["chosen_export"] != mine["rejected_export"]
    # lineage: preferences -> the votes snapshot -> both exports -> both checkpoints
    version = metadata["preferences"].value
    tree = podium_lake.lineage.upstream_of(version)

    def reached(node):
        yield node["version_id"]
        for child in node["upstream"]:
            yield from reached(child)

    ids = set(reached(tree))
    assert f"{VOTES}@{snapshot}" in ids
    assert {"export/evalsmoke@4", "export/evalsmoke@8", "ckpt/evalsmoke@4", "ckpt/evalsmoke@8"} <= ids
    # an SFT data config reads them: dataset `podium` (the chosen answers, each with its battle and voter)
    examples = build_examples(podium_lake, "podium")
    got = podium_lake.table("sft.examples").scan(row_filter=EqualTo("dataset", "podium")).to_arrow().to_pylist()
    by_battle = {p["battle_id"]: p for p in preferences}
    assert examples.rows == len(got) > 0 and examples.version_id.startswith("sft.examples@")
    for row in got:
        pair = by_battle[row["source_id"]]
        assert (row["prompt"], row["response"]) == (pair["prompt"], pair["chosen"])
        assert row["agent_chain"] == [pair["chosen_export"]] and row["source_table"] == PREFERENCES
    # an unchanged votes snapshot rebuilds nothing
    again = materialize([podium_leaderboard], resources=resources, instance=instance)
    assert again.asset_materializations_for_node("podium__leaderboard")[0].metadata["preferences"].value == version
