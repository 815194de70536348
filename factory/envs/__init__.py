"""Repository environments: fetch a repository, read how to build it (a rule table), resolve its
dependencies to pinned wheels, build a venv and run its tests in the sandbox, and record it all.

    from factory.envs.build import build_repos
    records = build_repos(repo_set, lake=lake, registry=RegistryConfig(index_url="file:///m/simple"))

Files: sources.py (RepoSource/RepoSet, fetching without running code), registry.py (index access,
wheels-only resolution, wheelhouse, lock), mirror.py (a local PEP 503 index for offline builds),
rules.py (the heuristics as data) + detect.py (one reader per rule -> BuildPlan), builder.py (the
Builder seam for an agent), build.py (the resolve/build/test phases, content-addressed storage),
outcomes.py (failure classes, BuildRecord), digest.py (tree digests), store.py (envs.builds,
envs.tests, lineage), environment.py + testrun.py (the built environment and running its tests),
commands.py (`factory envs ...`). Nothing is imported here, so `import factory.envs.x` stays light.
"""
