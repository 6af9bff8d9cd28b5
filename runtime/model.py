"""`Seq2Seq`: a loaded, checked, thread-safe exported model with one `predict` call."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .binding import BoundRunner, Runner, SessionRunner, runner
from .contract import (
    BEAM_STEP_FILE,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    FAST_FILES,
    FEEDBACK,
    GREEDY_FILE,
)
from .cuda import check_device_id
from .declared import TokenContract
from .decode_options import OPTION_NAMES, TRANSLATE_OPTIONS
from .defaults import INT8
from .denormals import flushing
from .errors import InputError, ResourceError, brief, one_line, short_of_memory
from .fused import GreedyLoop
from .graph_checks import check_session
from .manifest import Manifest, read_manifest
from .point_inputs import check_mask, check_outputs, check_source, check_target_len
from .points import BEFORE, Cancel, check_cancel, greedy_decode, stoppable
from .sessions import (
    CUDA,
    check_threads,
    open_session,
    read_graph,
    requested_providers,
)
from .spec import ModelSpec
from .token_steps import TokenSteps, fast_steps
from .tokens import Translation, load_vocabularies, translate
from .workers import Workers, check_workers

FAST_NAMES = frozenset(FAST_FILES.values())
ONE_CALL_ROLES = ("greedy", "wide_greedy", "beam", "wide_beam", "fold_greedy", "fold_beam",
                  "fold_few_beam")  # off with fused=False
# sessions without the CPU arena on the CPU (sessions.ARENA)
SMALL_CALLS = frozenset(FAST_FILES[r] for r in ("greedy", "beam", "fold_greedy", "fold_beam", "fold_few_beam"))


class Seq2Seq:
    """An exported encoder + decoder-step pair. Load once, then from any thread call `predict` (point models)
    or `translate_batch` (token models)."""

    def __init__(self, manifest: Manifest, sessions: dict[str, Any], path: Path,
                 vocabularies: dict[str, Any] | None = None, io_binding: bool = False, device_id: int = 0) -> None:
        self.manifest = manifest
        self.path = path
        self.vocabularies = vocabularies or {}
        self.io_binding = io_binding
        io = {name: (list(entry["inputs"]), list(entry["outputs"])) for name, entry in manifest.graphs.items()}
        self.step_inputs = io[DECODER_STEP_FILE][0]
        self._step = sessions[DECODER_STEP_FILE]
        # Graph-level access for parity tools: plain numpy in and out, whatever the decoding runners do.
        self.run_encoder: Runner = SessionRunner(sessions[ENCODER_FILE], io[ENCODER_FILE][1], ENCODER_FILE)
        self.run_step: Runner = SessionRunner(self._step, io[DECODER_STEP_FILE][1], DECODER_STEP_FILE)
        # Decoding: with IO binding, the encoder's outputs and the step's fed-back state stay on the device.
        self._encode, self._decode_step = self.run_encoder, self.run_step
        if io_binding:
            feedback = FEEDBACK if manifest.contract is None else manifest.contract.feedback
            fed_back = {out for out in io[DECODER_STEP_FILE][1] if out in feedback}
            self._encode = BoundRunner(sessions[ENCODER_FILE], io[ENCODER_FILE][1], ENCODER_FILE,
                                       set(io[ENCODER_FILE][1]), device_id)
            self._decode_step = BoundRunner(self._step, io[DECODER_STEP_FILE][1], DECODER_STEP_FILE, fed_back,
                                            device_id)
        contract = manifest.contract  # token models: what the graphs take and give, special ids, source rules
        loop_io = contract.greedy_io() if contract is not None else None
        eos = {} if contract is None else {"eos": contract.specials.eos}
        self._greedy = (GreedyLoop(manifest.spec, runner(sessions[GREEDY_FILE], io[GREEDY_FILE][1], GREEDY_FILE,
                                                         io_binding, set(), device_id), loop_io, **eos)
                        if GREEDY_FILE in sessions else None)
        fast = fast_steps(manifest.spec, sessions, io_binding, device_id, manifest.precision == INT8)
        beam_step = (runner(sessions[BEAM_STEP_FILE], io[BEAM_STEP_FILE][1], BEAM_STEP_FILE, io_binding,
                            {out for out in io[BEAM_STEP_FILE][1] if out in FEEDBACK}, device_id)
                     if BEAM_STEP_FILE in sessions else None)
        self._token_steps = (TokenSteps(manifest.spec, self._encode, self._decode_step, self._greedy, fast=fast,
                                        beam_step=beam_step, contract=contract)
                             if manifest.spec.kind == "tokens" else None)
        # load(workers=N): N models that decode every call whole, the first over this one's sessions (no reference
        # back to this model: its sessions go with it); int8 quantizes activations per call, so it never splits
        self._workers: Workers[Seq2Seq] | None = None
        self._token_workers: Workers[Any] | None = None
        self._splits = manifest.precision != INT8

    @classmethod
    def load(cls, path: str | Path, provider: str = "auto", threads: int | None = None, fused: bool = True,
             io_binding: bool | None = None, device_id: int = 0, fast: bool = True, workers: int = 1) -> "Seq2Seq":
        """Load an export directory, verifying version, hashes, graph I/O, spec and export id.

        fused: decode greedily with the export's greedy loop graph (one call per request) when it has one, and
        (a transformer's fast graphs) beam search with its beam graph; False decodes with the step loop (one call
        per output) and does not load those graphs.
        fast: decode with a transformer export's fast graphs (onnxruntime's fused kernels) when it has them and no
        attention is asked for; False uses the traced graphs only and does not load the fast ones.
        io_binding: keep the encoder's outputs and the decoder state on the execution device between calls
        (runtime.binding); None: on where the sessions run on CUDA, off on the CPU, where it only adds calls.
        device_id: the CUDA device (GPU ordinal) the sessions and bound state use.
        workers: copies of the sessions that decode the chunks of a call of many rows at once (runtime.workers:
        from 2 x SPLIT_ROWS rows, inputs x beams; seeded sampling runs whole); threads then defaults to 1, and
        workers x threads may not exceed the CPUs. Each copy holds the graphs' weights again."""
        threads = check_threads(threads)  # arguments first: nothing is read for a call that cannot succeed
        workers = check_workers(workers, threads)
        threads = 1 if threads is None and workers > 1 else threads
        device_id = check_device_id(device_id)
        requested_providers(provider)
        if provider == "cpu" and device_id:  # as the CLI refuses --device-id with --provider cpu
            raise InputError(f"device_id: {device_id} picks a GPU; with provider 'cpu' it would change nothing: leave "
                             "it at 0, or pass provider 'cuda' (or 'auto', which falls back to the CPU)")
        for name, flag in (("fused", fused), ("fast", fast)):
            if not isinstance(flag, bool):
                raise InputError(f"{name}: expected True or False, got {brief(flag)}")
        if io_binding is not None and not isinstance(io_binding, bool):
            raise InputError(f"io_binding: expected True or False or None, got {brief(io_binding)}")
        path = _model_dir(path)
        try:
            return cls._opened(path, provider, threads, fused, io_binding, device_id, fast, workers)
        except MemoryError as exc:  # raised below, without the MemoryError's frames
            error = ResourceError(f"{path}: loading the model needs more memory than this process has free "
                                  f"({one_line(exc) or 'MemoryError'}); raise its memory limit (ulimit -v) or free "
                                  "memory")
        raise error

    @classmethod
    def _opened(cls, path: Path, provider: str, threads: int | None, fused: bool, io_binding: bool | None,
                device_id: int, fast: bool, workers: int) -> "Seq2Seq":
        """`load` of checked arguments."""
        manifest = read_manifest(path)
        copies: list[dict[str, Any]] = [{} for _ in range(workers)]
        for name, entry in manifest.graphs.items():
            greedy = name in (GREEDY_FILE, *(FAST_FILES[r] for r in ONE_CALL_ROLES))
            if (greedy and not fused) or (name in FAST_NAMES and not fast):
                continue
            data = read_graph(path, name, entry["sha256"])  # read and checked once for every copy
            for sessions in copies:
                session = open_session(data, provider, threads, str(path / name), device_id,
                                       arena=name not in SMALL_CALLS)
                check_session(session, entry, manifest, path / name)
                sessions[name] = session
        on_cuda = copies[0][DECODER_STEP_FILE].get_providers()[0] == CUDA
        vocabularies = load_vocabularies(path, manifest) if manifest.vocabularies else None
        models = [cls(manifest, sessions, path, vocabularies, io_binding=on_cuda if io_binding is None else io_binding,
                      device_id=device_id) for sessions in copies]
        if workers > 1:  # the first copy's sessions again, in a model of its own that never splits a call
            whole = [cls(manifest, copies[0], path, vocabularies, io_binding=models[0].io_binding,
                         device_id=device_id), *models[1:]]
            models[0]._workers = Workers(whole)
            models[0]._token_workers = models[0]._workers.mapped(lambda model: model._token_steps)
        return models[0]

    @property
    def spec(self) -> ModelSpec:
        """The model's sizes and choices."""
        return self.manifest.spec

    @property
    def has_fused(self) -> bool:
        """True when greedy decoding runs in the export's greedy loop graph (one call per request)."""
        return self._greedy is not None

    @property
    def providers(self) -> list[str]:
        """Execution providers the sessions actually run on (first is preferred)."""
        return list(self._step.get_providers())

    @property
    def copies(self) -> list[Seq2Seq]:
        """The model's copies (`load(workers=N)`: N, each on sessions of its own; else this model), each decoding
        every call whole: a caller that runs whole calls side by side (`infer`'s batches) hands each one call at a
        time."""
        return list(self._workers.copies) if self._workers is not None else [self]

    def predict(
        self, source: Any, target_len: int | None = None, source_mask: Any = None, return_attention: bool = False,
        cancel: Cancel | None = None,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray | None]:
        """Decode (N, Ls, F) sources -> (N, Lt, F) points [and attention (N, [heads,] Lt, Ls)]. `cancel`, if
        given, is asked before the encoder and before every decoder step (the greedy loop graph: before its one
        call, and it and its encoder are watched while they run); when it returns True the decode stops with
        `runtime.errors.Cancelled` (a service's deadline, a client gone)."""
        if self.spec.kind != "points":
            raise InputError(f"source: {self.path} is a token model, which takes texts; call translate_batch(texts)")
        src = check_source(source, self.spec)
        steps = check_target_len(target_len, self.spec)
        mask = check_mask(source_mask, src)
        if not isinstance(return_attention, (bool, np.bool_)):  # numpy's too, as its ints elsewhere
            raise InputError(f"return_attention: expected True or False, got {brief(return_attention)}")
        check_cancel(cancel, src.shape[0])
        workers = self._workers if self._splits else None
        parts = workers.chunks(src.shape[0]) if workers is not None else [slice(0, src.shape[0])]

        def decode(model: Seq2Seq, rows: slice) -> tuple[np.ndarray, np.ndarray | None]:
            padded = source_mask is not None and not mask[rows].all()
            with flushing(rows.stop - rows.start > 1 or padded):  # one unpadded row has no mask
                return model._decode_points(src[rows], mask[rows], steps, cancel)

        try:
            found = workers.run(parts, decode) if workers is not None else [decode(self, parts[0])]
            outputs = found[0][0] if len(found) == 1 else np.concatenate([out for out, _ in found])
            attention = (found[0][1] if len(found) == 1 or found[0][1] is None
                         else np.concatenate([a for _, a in found]))
        except MemoryError as exc:  # raised below, without the MemoryError's frames (they hold the decode's arrays)
            error = short_of_memory(f"predict ({src.shape[0]} sources of {src.shape[1]} points, {steps} steps)", exc)
        else:
            check_outputs(src, outputs, attention)  # over the whole batch: a bad row is named by its own index
            return (outputs, attention) if return_attention else outputs
        raise error

    def _decode_points(self, src: np.ndarray, mask: np.ndarray, steps: int,
                       cancel: Cancel | None) -> tuple[np.ndarray, np.ndarray | None]:
        if src.shape[0] == 0:
            outputs, attention = self._empty(src, steps)
        elif self._greedy is not None:
            encode = self._encode if cancel is None else stoppable(self._encode, cancel, BEFORE)  # then watched
            states = encode({"source": src, "source_mask": mask}, cancel)
            points = self._greedy.points if cancel is None else stoppable(self._greedy.points, cancel)
            outputs, attention = points({**states, "source_mask": mask}, steps, cancel)  # watched while it runs
        else:
            run_encoder, run_step = ((self._encode, self._decode_step) if self.io_binding
                                     else (self.run_encoder, self.run_step))  # run_* may be replaced by a caller
            outputs, attention = greedy_decode(run_encoder, run_step, self.step_inputs, src, mask, steps, cancel)
        return outputs, attention

    def translate_batch(self, texts: Any, cancel: Cancel | None = None, **options: Any) -> list[list[Translation]]:
        """Texts -> n-best Translations per text; options as in `runtime.tokens` (CTranslate2's names).

        With return_attention, each Translation carries (len, Ls) weights: a transformer's are its last decoder
        layer's cross-attention averaged over heads. A transformer refuses sources and max_decoding_length beyond
        its spec.max_positions. `cancel`: as for `predict`."""
        if self.spec.kind != "tokens":
            raise InputError(f"texts: {self.path} is a point model, which takes numeric sources; call predict(source)")
        if not OPTION_NAMES.issuperset(options):
            unknown = sorted(set(options) - OPTION_NAMES)
            raise InputError(f"translate_batch: unknown options {unknown}; understood: "
                             f"{[*TRANSLATE_OPTIONS, 'cancel']}")
        try:
            return translate(self._token_steps, self.vocabularies, texts, cancel=cancel,
                             workers=self._token_workers if self._splits else None, **options)
        except MemoryError as exc:  # raised below, as predict's
            error = short_of_memory(f"translate_batch ({len(texts)} texts, beam_size {options.get('beam_size', 1)})",
                                    exc)
        raise error

    @property
    def contract(self) -> TokenContract | None:
        """A token model's contract (runtime.declared): its graphs' state, special ids, how it reads sources."""
        return self.manifest.contract

    @property
    def token_steps(self) -> TokenSteps | None:
        """Graph-level access for parity tools: a token model's encode/step functions (None for point models)."""
        return self._token_steps

    def _empty(self, src: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Batch 0: the right shapes, nothing run (onnxruntime 1.32's GRU kernel aborts the process on zero rows)."""
        outputs = np.zeros((0, steps, self.spec.n_features), dtype=np.float32)
        if not self.spec.has_attention:
            return outputs, None
        heads = (self.spec.n_heads,) if self.spec.attention == "multihead" else ()
        return outputs, np.zeros((0, *heads, steps, src.shape[1]), dtype=np.float32)

    def __repr__(self) -> str:
        return f"Seq2Seq(path={str(self.path)!r}, attention={self.spec.attention!r}, providers={self.providers})"


def _model_dir(path: Any) -> Path:
    """The caller's model directory as a Path; anything that cannot name one is an InputError."""
    try:
        model_dir = Path(path)
    except TypeError:
        model_dir = None
    if model_dir is None or "\0" in str(model_dir) or not str(path):
        raise InputError(f"path: expected a str or os.PathLike naming a model directory, got {brief(path)}")
    try:
        is_file = model_dir.is_file()
    except OSError:  # a name too long for the file system: reading the manifest says so
        is_file = False
    if is_file:  # e.g. its manifest.json: the directory beside it may be the export meant
        raise InputError(f"path: {model_dir} is a file; pass a directory written by `seq2onnx export`"
                         + (f" ({model_dir.parent}?)" if model_dir.name == "manifest.json" else ""))
    return model_dir
