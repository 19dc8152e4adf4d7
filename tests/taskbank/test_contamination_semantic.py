"""Contamination check, semantic and judge stages: embeddings, neighbours, cache, missing extra,
the judge hook, quarantine of suspects."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from controller.contracts.tasks import Task
from controller.taskbank import contamination, semantic
from controller.taskbank import contamination_eval as ev
from controller.taskbank.bank import TaskBank, make_set
from controller.taskbank.contamination import ContaminationConfig, check, check_against_training_sets
from controller.taskbank.curriculum import Curriculum
from controller.taskbank.judge import JudgeConfig
from nodeagent.verifier.checkers import judge_score
from tests.taskbank.test_contamination_codetext import GCD, GCD_COPY, HELD

FIELD = ("A farmer has a rectangular field whose length is three times its width. He walks "
         "around the whole field once and covers four hundred metres. What is the area of the "
         "field in square metres?")
FIELD_REPHRASED = ("Some grower owns an oblong plot; its long side measures triple the short "
                   "side. Strolling its full perimeter one time, he travels 400 m. Find the "
                   "plot's surface in m squared.")
# GSM8K test item 1 (MIT) and its rephrasing from llm-decontaminator (Apache-2.0)
ROBE = "A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in total does it take?"
ROBE_REPHRASED = ("A garment requires 2 bolts of blue fiber and half the amount of white fiber. "
                  "What is the total quantity of bolts needed?")
PRIMES = "How many prime numbers are there below one hundred?"
TRAINS = ("Two trains leave stations 300 km apart at the same time and travel towards each "
          "other at 70 km/h and 80 km/h. After how many hours do they meet?")


def _math(name: str, question: str) -> Task:
    return Task(name=name, family="math", hidden={"answer.txt": "1"},
                instruction="Solve the following problem.\n\n" + question,
                checker={"kind": "math", "answer": "1"})


class HashEmbedder:
    """Bag-of-words vectors (hashed words): texts sharing words are close. Counts its calls."""
    model_id = "test-hash"

    def __init__(self, same: dict[str, str] | None = None) -> None:
        self.calls = 0
        self.same = same or {}        # text -> text it should embed as (a "paraphrase")

    def embed(self, texts):
        self.calls += 1
        out = np.zeros((len(texts), semantic.DIMENSION), dtype=np.float32)
        for i, t in enumerate(texts):
            for word in self.same.get(t, t).lower().split():
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % semantic.DIMENSION] += 1
        return semantic.normalise(out)


@pytest.fixture(scope="module")
def minilm():
    try:
        return semantic.load_embedder()
    except semantic.SemanticUnavailable as exc:
        pytest.skip(str(exc))


def test_a_rephrased_copy_is_caught_by_the_semantic_stage_alone_with_its_cosine(minilm):
    train = make_set("train", [_math("math/robe", ROBE_REPHRASED), _math("math/field", FIELD),
                               _math("math/trains", TRAINS)])
    held = make_set("held", [_math("held/robe", ROBE), _math("held/primes", PRIMES)], "heldout")
    report = check(train, held, embedder=minilm)
    [s] = report.suspects
    assert (s.heldout_name, s.train_name, s.stages) == ("held/robe", "math/robe", ("semantic",))
    assert s.jaccard is None and s.cosine >= ContaminationConfig().cosine_threshold
    assert "semantic" in report.seconds and "semantic" not in report.skipped


def test_the_embeddings_are_unit_vectors_and_a_code_task_embeds_its_prompt_and_reference(minilm):
    code = Task(name="py/add", family="python", instruction="Write add(a, b).",
                files={"solution.py": "def add(a, b):\n    raise NotImplementedError\n"},
                hidden={"reference.py": "def add(a, b):\n    return a + b\n",
                        "test_hidden.py": "def test_add():\n    assert add(1, 2) == 3\n"},
                checker={"kind": "pytest", "tests": ["test_hidden.py"]})
    text = semantic.task_text(code)
    assert "Write add(a, b)." in text and "return a + b" in text and "assert" not in text
    vecs = minilm.embed([text, FIELD])
    assert vecs.shape == (2, semantic.DIMENSION)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_block_wise_nearest_neighbours_match_the_full_score_matrix():
    rng = np.random.default_rng(3)
    q = semantic.normalise(rng.normal(size=(50, 16)).astype(np.float32))
    b = semantic.normalise(rng.normal(size=(70, 16)).astype(np.float32))
    idx, sims = semantic.nearest(q, b, k=3, block_rows=7)
    full = q @ b.T
    assert (idx[:, 0] == full.argmax(axis=1)).all()
    assert np.allclose(sims, np.sort(full, axis=1)[:, ::-1][:, :3], atol=1e-6)
    assert (np.diff(sims, axis=1) <= 0).all()


def test_the_embedding_cache_embeds_a_training_set_once(tmp_path):
    emb = HashEmbedder()
    train = make_set("train", [_math("math/field", FIELD), _math("math/trains", TRAINS)])
    check(train, make_set("h1", [_math("held/p", PRIMES)], "heldout"), embedder=emb,
          cache_dir=tmp_path)
    assert emb.calls == 2
    check(train, make_set("h1", [_math("held/p", PRIMES)], "heldout"), embedder=emb,
          cache_dir=tmp_path)
    assert emb.calls == 2                      # everything came from the cache
    check(train, make_set("h2", [_math("held/f", FIELD + " Round up.")], "heldout"), embedder=emb,
          cache_dir=tmp_path)
    assert emb.calls == 3                      # only the new held-out task


def test_without_the_extra_the_check_names_it_and_still_runs_the_other_stages(monkeypatch):
    monkeypatch.setattr(semantic, "_importable", lambda module: module != "onnxruntime")
    contamination.default_embedder.cache_clear()
    try:
        train = make_set("train", [_math("math/field", FIELD)])
        report = check(train, make_set("held", [_math("held/field", FIELD)], "heldout"))
    finally:
        contamination.default_embedder.cache_clear()
    assert "paddock[semantic]" in report.skipped["semantic"]
    assert "onnxruntime" in report.skipped["semantic"]
    assert "semantic stage skipped" in report.summary_line()
    [s] = report.suspects
    assert s.stages == ("minhash", "ngram") and s.cosine is None


def test_the_semantic_stage_can_be_turned_off():
    emb = HashEmbedder()
    train = make_set("train", [_math("math/field", FIELD)])
    report = check(train, make_set("held", [_math("held/field", FIELD)], "heldout"),
                   ContaminationConfig(semantic=False), embedder=emb)
    assert emb.calls == 0 and report.skipped["semantic"].startswith("off")


class _Judge:
    """An OpenAI-compatible chat endpoint that calls a pair a copy when told to."""

    def __init__(self, copies: tuple[str, ...], fail: bool = False) -> None:
        self.requests: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                outer.requests.append(prompt)
                copy = any(c in prompt for c in copies)
                text = "no score" if fail else (
                    f"Same problem reworded.\nSCORE: {1 if copy else 0}")
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_judge_is_off_by_default_and_its_verdict_and_reason_are_reported():
    judge = _Judge(copies=("oblong plot",))
    try:
        emb = HashEmbedder(same={})
        train = make_set("train", [_math("math/field", FIELD), _math("math/trains", TRAINS)])
        held = make_set("held", [_math("held/field", FIELD), _math("held/primes", PRIMES)], "heldout")
        assert check(train, held, embedder=emb).skipped["judge"].startswith("off")
        assert judge.requests == []
        cfg = ContaminationConfig(judge=JudgeConfig(endpoint=judge.endpoint, model="m", min_cosine=0.0, score=judge_score))
        report = check(train, held, cfg, embedder=emb)
    finally:
        judge.close()
    by_name = {s.heldout_name: s for s in report.suspects}
    assert by_name["held/field"].judge_verdict == "clean"       # FIELD text has no "oblong plot"
    assert "score 0" in by_name["held/field"].judge_reason
    assert "held/primes" not in by_name                          # near-miss judged clean
    assert len(judge.requests) == 2


def test_a_near_miss_the_judge_calls_a_copy_becomes_a_suspect():
    judge = _Judge(copies=("oblong plot",))
    try:
        train = make_set("train", [_math("math/field", FIELD)])
        held = make_set("held", [_math("held/field", FIELD_REPHRASED)], "heldout")
        cfg = ContaminationConfig(judge=JudgeConfig(endpoint=judge.endpoint, model="m", min_cosine=0.0, score=judge_score))
        report = check(train, held, cfg, embedder=HashEmbedder())
    finally:
        judge.close()
    [s] = report.suspects
    assert s.stages == ("judge",) and s.judge_verdict == "contaminated"


def test_a_judge_without_a_score_is_the_verdict_error_not_a_crash():
    judge = _Judge(copies=(), fail=True)
    try:
        train = make_set("train", [_math("math/field", FIELD)])
        cfg = ContaminationConfig(judge=JudgeConfig(endpoint=judge.endpoint, model="m", score=judge_score))
        report = check(train, make_set("held", [_math("held/field", FIELD)], "heldout"), cfg,
                       embedder=HashEmbedder())
    finally:
        judge.close()
    [s] = report.suspects
    assert s.judge_verdict == "error" and "SCORE" in s.judge_reason


def test_import_check_quarantines_suspects_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(contamination, "default_embedder", lambda max_tokens: HashEmbedder())
    bank = TaskBank(tmp_path / "bank")
    bank.put_set(make_set("train", [_math("math/field", FIELD), _math("math/trains", TRAINS)]))
    held = make_set("held", [_math("held/field", FIELD), _math("held/primes", PRIMES)], "heldout")
    bank.put_set(held)
    ids = [t.task_id for t in held.tasks]
    [report] = check_against_training_sets(bank, "held")
    assert [s.heldout_name for s in report.suspects] == ["held/field"]
    with Curriculum(bank.root / "curriculum.sqlite", ids) as cur:
        assert cur.quarantined() == {}
    check_against_training_sets(bank, "held", quarantine=True)
    with Curriculum(bank.root / "curriculum.sqlite", ids) as cur:
        q = cur.quarantined()
    field_id = next(t.task_id for t in held.tasks if t.name == "held/field")
    assert list(q) == [field_id]
    assert q[field_id].startswith("contaminated: near train/math/field (cosine 1.000")
    assert (bank.root / "embeddings").is_dir()


def test_a_renamed_and_padded_code_copy_is_caught_by_its_prose_and_its_shape(minilm):
    train = make_set("train", [ev.code_task("gcd-copy", GCD_COPY), ev.code_task("other", HELD)])
    held = make_set("held", [ev.code_task("gcd", GCD)], "heldout")
    cfg = ContaminationConfig()
    (s,) = check(train, held, cfg, embedder=minilm).suspects
    assert (s.heldout_name, s.train_name, s.stages) == ("code/gcd", "code/gcd-copy", ("semantic",))
    assert s.structure == 1.0                   # every gram of the original's shape is in the copy
    assert s.cosine < cfg.code_cosine_alone <= s.semantic_score   # no executor: the semantic-only threshold
    w = cfg.code_structure_weight
    assert s.semantic_score == pytest.approx((1 - w) * s.cosine + w * s.structure, abs=1e-3)
    assert "structure 1.000" in contamination.format_suspect(s)
    # a math task is scored on its cosine alone, with no structure
    (m,) = check(make_set("t", [_math("math/robe", ROBE_REPHRASED)]),
                 make_set("h", [_math("held/robe", ROBE)], "heldout"), embedder=minilm).suspects
    assert m.structure is None and m.semantic_score == m.cosine


def test_the_int8_model_is_derived_once_and_embeds_like_the_shipped_one(minilm, tmp_path):
    path = semantic.int8_model(tmp_path)
    stamp = path.stat().st_mtime_ns
    assert semantic.int8_model(tmp_path) == path and path.stat().st_mtime_ns == stamp   # reused
    fast = semantic.MiniLMEmbedder(dynamic_int8=True, model_dir=tmp_path)
    shipped = semantic.MiniLMEmbedder(dynamic_int8=False)
    assert fast.model_id != shipped.model_id          # cached vectors of the two never mix
    texts = [ROBE, ROBE_REPHRASED, PRIMES, TRAINS, FIELD]
    a, b = fast.embed(texts), shipped.embed(texts)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert (np.sum(a * b, axis=1) > 0.97).all()
    assert a[0] @ a[1] > a[0] @ a[2]                  # still finds the rephrasing nearest


def test_the_derived_model_runs_each_layers_attention_as_one_int8_node(minilm, tmp_path):
    import onnx
    ops = [n.op_type for n in onnx.load(str(semantic.int8_model(tmp_path))).graph.node]
    assert ops.count("QAttention") == 6          # one per encoder layer
    assert "Softmax" not in ops and "IsNaN" not in ops and ops.count("MatMulInteger") == 18
    assert semantic.DERIVED_SUFFIX in semantic.int8_model(tmp_path).name


def test_workers_embed_batches_side_by_side_into_the_same_rows(minilm, tmp_path):
    texts = [ROBE, ROBE_REPHRASED, PRIMES, TRAINS, FIELD, FIELD_REPHRASED] * 3 + [PRIMES + " " + TRAINS]
    one = semantic.MiniLMEmbedder(batch_size=2, workers=1, model_dir=tmp_path)
    two = semantic.MiniLMEmbedder(batch_size=2, workers=2, model_dir=tmp_path)
    a, b = one.embed(texts), two.embed(texts)
    assert np.array_equal(a, b)                   # a batch's vectors do not depend on its worker
    assert a[0] @ a[1] > a[0] @ a[2] and a[0] @ a[6] > 0.98   # each row is its own text's


def test_two_checks_saving_one_cache_at_once_never_collide(tmp_path):
    """Two processes' checks on one bank each save the embedding cache; before, both wrote the
    same temporary file and one failed with FileNotFoundError at the rename."""
    import threading

    import numpy as np

    from controller.taskbank.semantic import DIMENSION, EmbeddingCache, text_key
    caches = [EmbeddingCache(tmp_path, "m", 128) for _ in range(2)]
    for n, c in enumerate(caches):
        c.put_many([text_key(f"{n}-{i}") for i in range(50)], np.ones((50, DIMENSION), np.float32))
    errors = []

    def save_often(c):
        try:
            for _ in range(30):
                c.save()
        except Exception as exc:        # noqa: BLE001 - the failure this test looks for
            errors.append(exc)
    threads = [threading.Thread(target=save_often, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(EmbeddingCache(tmp_path, "m", 128)._vecs) == 50      # one of the two, whole
    assert [p.name for p in tmp_path.iterdir()] == ["m-t128.npz"]   # no temporary left
