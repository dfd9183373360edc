"""Is this file an ExecuTorch program? Checked before anything is stored or queued.

A .pte is a flatbuffer with file identifier "ET" + two digits at offset 4 (ET12 today), and,
when segments live outside the flatbuffer, an extended header "eh00" at offset 8 giving the
program size and where the segment data ends: a truncated upload fails those bounds.

`prepare` goes further for a submission: a bundled program (.bpte, identifier BP08) is unpacked
into its program and its first test case's inputs; the program's methods (ExecutionPlan name,
inputs, values) are read, so a missing method or inputs the method would refuse (dtype, shape,
count, a non-tensor value other than the exported one) are a 422 at submission, not a failed run.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

from sme2farm.analysis import pte
from sme2farm.analysis.llm import CONVENTION_WORDS, LLM_SHAPE_WORDS, llm_cache_len, llm_signature, not_llm_reason
from sme2farm.protocol import LlmSpec
from sme2farm.runners import bpte, input_check, npz
from sme2farm.runners import inputs as inp
from sme2farm.server.services import stored

MIN_SIZE = 16


class InvalidProgram(ValueError):
    field = "model"  # the part of the request a 422 names


def validate(path: Path) -> None:
    size = path.stat().st_size
    if size == 0:
        raise InvalidProgram("the model file is empty")
    if size < MIN_SIZE:
        raise InvalidProgram(f"the model file is {size} bytes: too short to be an ExecuTorch program")
    with open(path, "rb") as f:
        head = f.read(40)
    ident = head[4:8]
    if not (ident[:2] == b"ET" and ident[2:4].isdigit()):
        raise InvalidProgram("not an ExecuTorch program: the flatbuffer file identifier is not ET## (is this a .pte?)")
    (root,) = struct.unpack_from("<I", head, 0)
    if root >= size:
        raise InvalidProgram("truncated ExecuTorch program: the flatbuffer root lies past the end of the file")
    if head[8:12] == b"eh00" and len(head) >= 40:
        hlen, program_size, seg_base, seg_size = struct.unpack_from("<IQQQ", head, 12)
        if program_size > size:
            raise InvalidProgram(f"truncated ExecuTorch program: header says {program_size} bytes of program, file has {size}")
        if seg_size and seg_base + seg_size > size:
            raise InvalidProgram(f"truncated ExecuTorch program: segment data ends at byte {seg_base + seg_size}, file has {size}")


# ---- the program's methods and the run's inputs ---------------------------------------------

DEFAULT_INPUTS = "all ones (default)"
_COPY_CHUNK = 1 << 20


class InvalidInputs(InvalidProgram):
    """A problem with the inputs or the method; `field` says which part of the request to blame."""

    def __init__(self, message: str, field: str = "inputs"):
        super().__init__(message)
        self.field = field


def prepare(upload, *, method: str, tmp_dir: Path, max_inputs_bytes: int) -> None:
    """Turn an upload into what is stored: a validated program and, where inputs were given, an
    SME2IN01 container checked against the method. Mutates `upload` (server/uploads.Upload):
    a .bpte's temp file is replaced by its embedded program's, the .npz's by the container's.
    Raises InvalidProgram / InvalidInputs; the caller discards the upload's temp files then."""
    with open(upload.model_path, "rb") as f:
        head = f.read(8)
    inputs = None
    if bpte.is_bundled_program(head):
        if upload.inputs_path is not None:
            raise InvalidInputs("a .bpte carries its own inputs; send either a .bpte, or a .pte with an 'inputs' .npz")
        _unbundle(upload, method, tmp_dir, max_inputs_bytes)
        inputs, description = upload.bundled.inputs, upload.bundled.description
    methods = upload.methods = _read_methods(upload.model_path, "model")  # read once: llm_mode and llm_note reuse it
    if method not in methods:
        raise InvalidInputs(f"the program has no method {method!r}; it has: {', '.join(methods) or 'none'}", "spec.method")
    sig = methods[method]
    vs_sig = _vs_signature(upload, method) if upload.vs_model_path is not None else None
    if upload.inputs_path is not None:
        try:
            inputs = npz.read_npz(upload.inputs_path, signature=sig, max_bytes=max_inputs_bytes)
        except inp.InputsError as e:
            raise InvalidInputs(str(e)) from None
        name = upload.inputs_filename or "inputs.npz"
        description = f"{name}: {inp.plural(len(inputs))}" + (f" ({inp.summary(inputs)})" if inputs else "")
    if inputs is None:
        return
    if vs_sig is not None:
        try:
            input_check.check(vs_sig, inputs)
        except inp.InputsError as e:
            raise InvalidInputs(f"the inputs fit the model but not the vs_model (both are fed the same inputs): {e}",
                                "inputs" if upload.inputs_path is not None else "vs_model") from None
    try:
        input_check.check(sig, inputs)
        blob = inp.write(inputs)
    except inp.InputsError as e:
        # a .bpte's inputs are part of the model the user sent
        raise InvalidInputs(f"{'bundled inputs do not fit: ' if upload.inputs_path is None else ''}{e}",
                            "inputs" if upload.inputs_path is not None else "model") from None
    fd, name = tempfile.mkstemp(dir=tmp_dir, suffix=".inputs")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
    except BaseException:  # disk full: no partial container left in the temp dir
        os.unlink(name)
        raise
    if upload.inputs_path is not None:
        upload.inputs_path.unlink()
    upload.inputs_path = Path(name)
    upload.inputs_sha256 = hashlib.sha256(blob).hexdigest()
    upload.inputs_size = len(blob)
    upload.inputs_description = description[:400]


def _vs_signature(upload, method: str):
    """The vs_model's signature of `method` (a .pte: the inputs, if any, come with `model`)."""
    with open(upload.vs_model_path, "rb") as f:
        if bpte.is_bundled_program(f.read(8)):
            raise _blaming(InvalidProgram("send a .pte as the vs_model (a .bpte's inputs would differ from the model's)"),
                           "vs_model")
    methods = upload.vs_methods = _read_methods(upload.vs_model_path, "vs_model")
    if method not in methods:
        raise _blaming(InvalidProgram(f"the vs_model has no method {method!r}; it has: {', '.join(methods) or 'none'}"),
                       "vs_model")
    return methods[method]


def _blaming(e: InvalidProgram, field: str) -> InvalidProgram:
    e.field = field
    return e


def _read_methods(path: Path, field: str) -> dict:
    """A validated program's method signatures; a problem is an InvalidProgram naming `field`."""
    try:
        validate(path)
    except InvalidProgram as e:
        raise _blaming(e, field) from None
    with pte.mapped(path) as m:
        try:
            return pte.program_methods(m, end=pte.program_end(m))
        except pte.PteError as e:
            raise _blaming(InvalidProgram(f"cannot read the program's methods: {e}"), field) from None


def _unbundle(upload, method: str, tmp_dir: Path, max_inputs_bytes: int) -> None:
    """Replace the .bpte temp file by its embedded program (hashed as it is copied)."""
    with pte.mapped(upload.model_path) as m:
        try:
            bundled = bpte.read_bundled(m, method, max_bytes=max_inputs_bytes)
        except inp.InputsError as e:
            raise InvalidInputs(str(e), "model") from None
        fd, name = tempfile.mkstemp(dir=tmp_dir, suffix=".pte")
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as f:
                end = bundled.program_offset + bundled.program_size
                for pos in range(bundled.program_offset, end, _COPY_CHUNK):
                    chunk = m[pos:min(pos + _COPY_CHUNK, end)]
                    h.update(chunk)
                    f.write(chunk)
        except BaseException:
            os.unlink(name)
            raise
    upload.model_path.unlink()
    upload.model_path, upload.sha256, upload.size = Path(name), h.hexdigest(), bundled.program_size
    upload.bundled = bundled


# ---- LLM mode: detected from the method's signature, or asked for and checked ---------------

DEFAULT_LLM_PROMPT, DEFAULT_LLM_DECODE = 128, 64


def llm_mode(path: Path, *, method: str, llm, has_inputs: bool, field: str = "model", methods: dict | None = None):
    """The LLM mode a submission runs in (a protocol.LlmSpec, or None), after `prepare` accepted
    the program and its method. The method's LLM shape (analysis.llm.llm_signature): tokens
    [1, S] and either the start position [1] or the call's positions [S], as ExecuTorch's runner
    tells them apart. Asked for (`llm` given): the method must have that shape, the prompt fit
    one call or the program declare its cache length (the runner then prefills in calls of at
    most S tokens), prompt + decode fit that cache, and no inputs file be given (the runner feeds
    the tokens). Not asked for: a method with the LLM shape gets a prompt of min(128, S, C/2) and
    min(64, C/4) decoded tokens, C the declared cache length (else S), when its token length is
    dynamic, or when it takes one token per call and declares its cache (prefilled token by
    token). Raises InvalidInputs naming spec.llm. `methods`: the program's, when `prepare` read
    them already."""
    methods = _read_methods(path, field) if methods is None else methods
    sig = methods[method]
    shape = llm_signature(sig)
    cache = llm_cache_len(methods)
    if llm is None:
        return _default_llm(shape, cache) if shape is not None and not has_inputs else None
    if shape is None:
        takes = ", ".join(str(i) for i in sig.inputs) or "no inputs"
        raise InvalidInputs(f"LLM mode needs method {method!r} to take {LLM_SHAPE_WORDS}; it takes {takes}",
                            "spec.llm")
    if has_inputs:
        raise InvalidInputs("LLM mode feeds the tokens itself: send no inputs (.npz or .bpte) with spec.llm", "spec.llm")
    max_tokens, dynamic, _ = shape
    if not dynamic and max_tokens > 1 and (llm.prompt != max_tokens or llm.decode > 0):
        raise InvalidInputs(f"method {method!r} takes exactly {max_tokens} tokens per call (a static length): it cannot "
                            f"prefill {llm.prompt} tokens and decode one at a time", "spec.llm")
    if llm.prompt > max_tokens and cache is None:
        raise InvalidInputs(f"a prompt of {llm.prompt} tokens is longer than the {max_tokens} tokens method {method!r} "
                            "takes in one call, and the program declares no cache length (get_max_context_len) to "
                            "prefill it in several calls", "spec.llm.prompt")
    if cache is not None and llm.prompt + llm.decode > cache:
        raise InvalidInputs(f"a prompt of {llm.prompt} tokens and {llm.decode} decoded run past the cache: the program "
                            f"holds {cache} positions (prompt + decode must be at most that)", "spec.llm")
    return llm


def _default_llm(shape, cache: int | None):
    """The LLM mode a method of this shape runs in unasked, or None (no room for a prompt and a
    decoded token, or a static length of several tokens that cannot decode one at a time)."""
    max_tokens, dynamic, _ = shape
    positions = cache or max_tokens
    prompt = min(DEFAULT_LLM_PROMPT, positions // 2, max_tokens if dynamic else positions)
    if not (dynamic or (max_tokens == 1 and cache is not None)) or prompt < 1:
        return None
    return LlmSpec(prompt=prompt, decode=min(DEFAULT_LLM_DECODE, max(positions // 4, 1)))


def llm_note(path: Path, *, method: str, llm, has_inputs: bool, field: str = "model",
             methods: dict | None = None) -> str | None:
    """One sentence for the experiment's notes: the position convention an LLM run feeds, or,
    when the method looks like a decoder (int64 tokens in, logits out) but runs as a plain model,
    what was found and why; None for a program that looks like no decoder. `methods` as for llm_mode."""
    methods = _read_methods(path, field) if methods is None else methods
    sig = methods[method]
    shape = llm_signature(sig)
    if llm is not None and shape is not None:
        return (f"LLM mode: method {method!r} takes tokens Long[1, S] and {CONVENTION_WORDS[shape.convention]}, "
                f"as ExecuTorch's LLM runner tells them apart; each call is fed that")
    reason = not_llm_reason(sig, has_inputs)
    if reason is not None or shape is None:
        return reason
    cache = llm_cache_len(methods)
    if not shape.dynamic and shape.max_tokens > 1:
        why = (f"it takes exactly {shape.max_tokens} tokens per call (a static length), so it cannot decode one "
               "token at a time")
    elif not shape.dynamic and cache is None:
        why = "it takes one token per call and declares no cache length (get_max_context_len or get_max_seq_len)"
    else:
        why = "it has no room for a prompt and a decoded token"
    return (f"method {method!r} takes the LLM shape (tokens and {CONVENTION_WORDS[shape.convention]}) but {why}: "
            "it ran as a plain model (one forward call on the default inputs, no prefill/decode split)")


def memory_of(path: Path, field: str = "model") -> dict:
    """A validated program's planned memory and data sizes (analysis.pte.ProgramMemory.to_dict()),
    stored with the model; a program whose segments do not add up is an InvalidProgram."""
    with pte.mapped(path) as m:
        try:
            return pte.program_memory(m, end=pte.program_end(m)).to_dict()
        except pte.PteError as e:
            raise _blaming(InvalidProgram(f"cannot read the program's memory plan: {e}"), field) from None


def read_memory(upload) -> None:
    """Set upload.memory (and vs_memory) from its validated programs (after prepare)."""
    upload.memory = memory_of(upload.model_path)
    if upload.vs_model_path is not None:
        upload.vs_memory = memory_of(upload.vs_model_path, "vs_model")


def memory_for(memory: dict | None, method: str) -> dict | None:
    """A stored model's memory (memory_of) for one method, as protocol.ProgramMemory's fields;
    None when it was not recorded or the method is not the program's."""
    program = stored.program_memory(memory)
    if program is None or method not in program.planned:
        return None
    return program.to_dict(method)
