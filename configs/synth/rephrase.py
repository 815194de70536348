"""Rephrasing: standard-library functions with an explanation written by the model above them
(raw code → code with explanation). Three stages — extract a function (programmatic), explain it
(the latest export through the in-process engine), assemble — then validators. At smoke scale the
explanations are poor; the mechanics (provenance, rejection reasons, the export id) are real.
"""

from factory.synth import PipelineConfig


def rephrase() -> PipelineConfig:
    return PipelineConfig(
        name="rephrase",
        description="Standard-library functions with a model-written explanation above them.",
        seeds={"table": "refined.python_stdlib", "columns": ("doc_id", "path", "text"), "id_field": "doc_id",
               "limit": 64},
        stages=[
            {"name": "extract", "output": "function",
             "generator": {"kind": "function", "function": "factory.synth.shapes:first_function"}},
            {"name": "explain", "output": "explanation",
             "generator": {"kind": "engine", "template": "{function}\n\n# What the function above does, in plain words:\n#",
                           "max_tokens": 64, "temperature": 0.7, "stop": ("\n\n",)}},
            {"name": "assemble", "output": "program",
             "generator": {"kind": "function", "function": "factory.synth.shapes:explained"}},
        ],
        validators=[
            {"kind": "length", "field": "explanation", "min_chars": 24, "max_chars": 600},
            {"kind": "python_syntax"},
            {"kind": "dedup", "against": ("synthetic.rephrase",)},
            {"kind": "decontaminate"},
        ],
        text="{program}",
        kind="code",
        budget={"max_attempts": 2},
    )
