"""Task derivation's pure parts, no sandbox: locating functions, removing and splicing bodies, each
mutation operator (checked against the AST it meant), inverse patches that `patch -p1` and
`git apply` accept, the bug-fix patch checks, and decontamination against HumanEval. Runs anywhere
(CPU, a second or two; `patch` and `git` binaries)."""

from __future__ import annotations

import ast
import subprocess
import textwrap

import pytest

from factory.tasks.completion import PLACEHOLDER, CandidateError, completion_candidates, remove_body, splice
from factory.tasks.decontam import Decontaminator
from factory.tasks.mutation import mutants, mutation_candidates
from factory.tasks.score import check_patch, unfence
from factory.tasks.source import find_function, functions, mentioning, unified_diff

SOURCE = textwrap.dedent('''\
    import math


    def clamp(x, lo, hi):
        """Clamp x into [lo, hi]."""
        if x < lo:
            return lo
        elif x > hi:
            return hi
        else:
            return x


    class Stack:
        def __init__(self):
            self.items = []

        @property
        def size(self):
            return len(self.items)

        def windows(self, n: int = 2) -> list:
            out = []
            for i in range(len(self.items) - 1):
                if i >= 0 and n > 1:
                    out.append(self.items[i:i + n])
            return out


    def one(): return 1


    def stub():
        """Nothing yet."""
        raise NotImplementedError
    ''')


def test_functions_are_found_with_their_edit_lines():
    sites = {s.qualname: s for s in functions(SOURCE)}
    assert list(sites) == ["clamp", "Stack.__init__", "Stack.size", "Stack.windows", "one", "stub"]
    clamp = sites["clamp"]
    assert (clamp.def_line, clamp.keep_end, clamp.end_line, clamp.body_indent) == (4, 5, 11, "    ")
    assert clamp.complexity == 3  # 1 + if + elif
    assert sites["Stack.size"].first_line == sites["Stack.size"].def_line - 1  # the decorator's line
    assert not sites["one"].removable and sites["Stack.windows"].complexity == 4  # for, if, and


def test_a_multiline_signature_with_colons_ends_at_its_own_colon():
    text = "def f(a: dict[str, int] = {'k': 1},\n      g=lambda y: y) -> int:\n    return a['k']\n"
    site = find_function(text, "f")
    assert site.header_end == 2 and site.removable
    broken, removed = remove_body(text, "f")
    assert removed == "    return a['k']\n" and broken.endswith(f"    {PLACEHOLDER}\n")


def test_body_removal_keeps_signature_and_docstring_and_the_reference_splices_back_exactly():
    broken, removed = remove_body(SOURCE, "clamp")
    assert '"""Clamp x into [lo, hi]."""\n    raise NotImplementedError\n\n\nclass Stack' in broken
    assert removed.startswith("    if x < lo:") and removed.endswith("        return x\n")
    assert splice(broken, "clamp", removed) == SOURCE
    method_broken, method_body = remove_body(SOURCE, "Stack.windows")
    assert splice(method_broken, "Stack.windows", method_body) == SOURCE


def test_splice_accepts_a_body_or_the_whole_function_and_refuses_what_leaves_it():
    broken, _ = remove_body(SOURCE, "Stack.windows")
    body = splice(broken, "Stack.windows", "return [self.items]")  # unindented body: re-indented
    assert "        return [self.items]\n" in body and ast.parse(body)
    whole = splice(broken, "Stack.windows", "```python\ndef windows(self, n=2):\n    return []\n```".strip("`")
                   .removeprefix("python\n"))
    assert "    def windows(self, n=2):\n        return []\n" in whole
    with pytest.raises(CandidateError, match="does not parse"):
        splice(broken, "Stack.windows", "return (")
    with pytest.raises(CandidateError, match="changes code outside"):
        splice(broken, "Stack.windows", "        return []\n    def size(self):\n        return 99")
    with pytest.raises(CandidateError, match="empty"):
        splice(broken, "Stack.windows", "\n  \n")
    assert unfence("```python\nreturn 1\n```") == "return 1"


def test_completion_candidates_need_a_test_file_naming_them_and_skip_stubs(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SOURCE)
    tests = {"tests/test_mod.py": "from pkg.mod import clamp, Stack\n\ndef test_clamp():\n    assert clamp(5, 0, 1) == 1\n"
             "    s = Stack()\n    s.windows()\n\ndef test_stub():\n    stub\n"}
    found = {c.target: c for c in completion_candidates(tmp_path, tests)}
    # __init__ is covered through its class's name; size and one are never named; stub is a stub
    assert sorted(found) == ["Stack.__init__", "Stack.windows", "clamp"]
    assert found["clamp"].test_files == ("tests/test_mod.py",) and found["clamp"].lines_removed == 6
    assert mentioning("clamp", {"a.py": "clamped = 1"}) == ()


@pytest.mark.parametrize("operator, words, before, after", [
    ("compare_flip", "< -> >=", "    if x < lo:", "    if x >= lo:"),
    ("compare_flip", "> -> <=", "    elif x > hi:", "    elif x <= hi:"),
    ("drop_branch", "else at L10 removed", "    else:\n        return x\n", ""),
    ("drop_branch", "if body at L6 -> pass", "        return lo\n", "        pass\n"),
])
def test_each_clamp_mutation_changes_one_spot(operator, words, before, after):
    found = [m for m in mutants(SOURCE, find_function(SOURCE, "clamp")) if m.operator == operator and words in m.description]
    assert len(found) == 1, [m.description for m in mutants(SOURCE, find_function(SOURCE, "clamp"))]
    assert found[0].text == SOURCE.replace(before, after, 1)


def test_off_by_one_and_bool_swap_on_a_method():
    every = [m for m in mutants(SOURCE, find_function(SOURCE, "Stack.windows")) if m.operator in ("off_by_one", "bool_swap")]
    found = {m.description.split(" ", 2)[2]: m for m in every}
    assert found["range stop + 1"].text == SOURCE.replace("range(len(self.items) - 1)", "range(len(self.items) - 1 + 1)")
    constants = [m.text for m in every if m.description.endswith("1 -> 0")]
    assert len(constants) == 2  # the range's '- 1' and the 'n > 1'
    assert SOURCE.replace("range(len(self.items) - 1)", "range(len(self.items) - 0)") in constants
    assert found["and -> or"].text == SOURCE.replace("i >= 0 and n > 1", "i >= 0 or n > 1")


def test_bool_swap_parenthesizes_when_precedence_would_regroup():
    text = "def f(a, b, c):\n    return a and b or c\n"
    (swap,) = [m for m in mutants(text, find_function(text, "f")) if m.description.endswith("and -> or")]
    assert "return (a or b) or c" in swap.text


def test_inverse_patch_round_trips_with_patch_and_git_apply(tmp_path):
    mutant = next(m for m in mutants(SOURCE, find_function(SOURCE, "clamp")) if m.operator == "compare_flip")
    diff = unified_diff("pkg/mod.py", mutant.text, SOURCE)
    check_patch(diff, "pkg/mod.py")
    for tool in (["patch", "-p1", "--batch", "--silent"], ["git", "apply", "-"]):
        repo = tmp_path / tool[0]
        (repo / "pkg").mkdir(parents=True)
        (repo / "pkg" / "mod.py").write_text(mutant.text)
        done = subprocess.run(tool, input=diff, cwd=repo, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert (repo / "pkg" / "mod.py").read_text() == SOURCE
    no_newline = unified_diff("f.py", "a = 1\n", "a = 2")
    assert no_newline.endswith("+a = 2\n\\ No newline at end of file\n")


def test_bug_fix_patches_may_only_be_unified_diffs_of_the_task_file():
    good = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,1 +1,1 @@\n-a = 1\n+a = 2\n"
    check_patch(good, "pkg/mod.py")
    with pytest.raises(CandidateError, match="only pkg/mod.py"):
        check_patch(good.replace("pkg/mod.py", "tests/test_mod.py"), "pkg/mod.py")
    with pytest.raises(CandidateError, match="not part of a unified diff"):
        check_patch("1c1\n< a = 1\n---\n> a = 2\n", "pkg/mod.py")  # a normal diff (and ed scripts)
    with pytest.raises(CandidateError, match="no hunks"):
        check_patch("--- a/pkg/mod.py\n+++ b/pkg/mod.py\n", "pkg/mod.py")
    with pytest.raises(CandidateError, match="ends inside a hunk"):
        check_patch("--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n-a = 1\n+a = 2\n", "pkg/mod.py")
    # a removed line that starts with '-- ' stays a hunk line, not a header
    check_patch("--- a/q.sql\n+++ b/q.sql\n@@ -1,1 +1,1 @@\n--- old\n+-- new\n", "q.sql")


def test_decontamination_catches_humaneval_text_and_bodies_and_passes_repo_code():
    from factory.evals.humaneval import problems

    first = problems()[0]
    decontam = Decontaminator(("humaneval",), 13)
    copied = first["prompt"] + first["canonical_solution"]
    assert decontam.verdict(copied).startswith("humaneval:HumanEval/0 (")
    renamed = "def add_numbers(x: int, y: int):\n    # same body, other name and no docstring\n    return x + y\n"
    assert decontam.verdict(renamed) == "humaneval:HumanEval/53 (same body)"
    assert decontam.verdict(SOURCE) is None
    assert decontam.label.startswith("humaneval@") and decontam.label.endswith("13-gram+body")


def test_mutation_candidates_are_seeded_and_carry_an_inverse_patch(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SOURCE)
    tests = {"tests/test_mod.py": "from pkg.mod import clamp, Stack\nclamp\nStack().windows\n"}

    def drawn(seed):
        return [(c.target, c.mutation) for c in mutation_candidates(tmp_path, tests, seed=seed, tries_per_function=2)]

    assert drawn(0) == drawn(0) and len(drawn(0)) == 4  # 2 each of clamp and windows (__init__ has no site)
    assert {drawn(s)[0] for s in range(6)} != {drawn(0)[0]}  # another seed, another order
    first = next(iter(mutation_candidates(tmp_path, tests, seed=0)))
    assert first.reference == unified_diff("pkg/mod.py", first.broken, SOURCE) and first.lines_removed >= 1


def test_guard_flags_what_a_candidate_adds_not_what_the_file_had():
    from factory.tasks.guard import tampering

    original = "import sys\n\ndef f(x):\n    return x + 1\n\ndef g():\n    sys.exit(2)\n"
    assert tampering(original, original) is None
    assert tampering(original, original.replace("return x + 1", "return x + 2")) is None
    frames = original.replace("return x + 1", "sys._getframe(2).f_globals['expected'] = x\n    return x")
    assert "uses _getframe, f_globals" in tampering(original, frames)
    assert "imports os" in tampering(original, original.replace("return x + 1", "import os; os._exit(0)"))
    # sys.exit is the original's own: one more is an addition, the same count is not
    assert "uses exit" in tampering(original, original.replace("return x + 1", "sys.exit(0)"))
    modules = original.replace("return x + 1", "sys.modules['pytest'] = None\n    return x + 1")
    assert "uses modules" in tampering(original, modules)
