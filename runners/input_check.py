"""Inputs and outputs held against the program's method signatures (analysis/pte.py), before
anything is queued and when an outputs file comes back.

Non-tensor inputs: ExecuTorch bakes ints, doubles and bools into the program at export and refuses
any other value at run time ("should have the same value as the input_evalue"), so `check` names
such a mismatch at submission instead. `check_outputs` holds a runner's outputs file against the
outputs the program declares (`MethodSignature.outputs`).
"""

from __future__ import annotations

from sme2farm.analysis.pte import DYNAMIC_BOUND, STATIC, InputSpec, MethodSignature, scalar_name
from sme2farm.runners.inputs import (NUMPY_NAMES, SCALAR_TYPES, Input, InputsError, TensorInput, describe_value,
                                     plural, summary)


def check(sig: MethodSignature, inputs: list[Input]) -> None:
    """Raise InputsError naming the first input the method would refuse."""
    if len(inputs) != len(sig.inputs):
        raise InputsError(f"method {sig.name} takes {plural(len(sig.inputs))} ({summary(list(sig.inputs))}), "
                          f"{len(inputs)} given")
    for i, (spec, v) in enumerate(zip(sig.inputs, inputs)):
        if v is None:
            continue
        where = f"input {i} of method {sig.name}"
        if spec.kind == "tensor":
            if not isinstance(v, TensorInput):
                raise InputsError(f"{where} is a tensor {spec}, got {describe_value(v)}")
            if v.scalar_type != spec.scalar_type:
                raise InputsError(f"{where} takes {spec}, got {v}: dtype {scalar_name(v.scalar_type)} is not "
                                  f"{scalar_name(spec.scalar_type)}" + _dtype_hint(spec.scalar_type))
            if len(v.sizes) != len(spec.sizes):
                raise InputsError(f"{where} takes {spec}, got {v}: {len(v.sizes)} dimensions, not {len(spec.sizes)}")
            if spec.dynamism == STATIC and tuple(v.sizes) != spec.sizes:
                raise InputsError(f"{where} takes {spec}, got {v}: the shape differs and the method's shape is static")
            if spec.dynamism == DYNAMIC_BOUND and any(a > b for a, b in zip(v.sizes, spec.sizes)):
                raise InputsError(f"{where} takes {spec}, got {v}: a dimension exceeds the method's upper bound")
        elif spec.kind in ("int", "double", "bool"):
            kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else \
                "double" if isinstance(v, float) else "tensor"
            if kind != spec.kind:
                raise InputsError(f"{where} is {'an' if spec.kind == 'int' else 'a'} {spec.kind}, got {describe_value(v)}")
            if v != spec.value:
                raise InputsError(f"{where} was exported as {describe_value(spec.value)}, got {describe_value(v)}: "
                                  "ExecuTorch fixes non-tensor inputs at export and refuses any other value")
        else:
            raise InputsError(f"{where} is a {spec.kind}, which an inputs file cannot supply")


def check_outputs(sig: MethodSignature, outputs: list[Input]) -> None:
    """Raise InputsError naming the first output of an outputs file (runner --outputs_file) that
    the method does not declare: the count, a tensor's dtype and shape (a dynamic dimension may
    be smaller than its upper bound), a scalar's kind. An output the container cannot carry
    (a list, a dtype outside SCALAR_TYPES) must be kind 0, none."""
    if len(outputs) != len(sig.outputs):
        raise InputsError(f"the outputs file holds {plural(len(outputs), 'output')}, method {sig.name} declares "
                          f"{len(sig.outputs)} ({', '.join(_declared(s) for s in sig.outputs)})")
    for i, (spec, v) in enumerate(zip(sig.outputs, outputs)):
        where = f"output {i} of method {sig.name}"
        carried = spec.kind in ("int", "double", "bool") or (spec.kind == "tensor" and spec.scalar_type in SCALAR_TYPES)
        if v is None:
            if carried:
                raise InputsError(f"the outputs file leaves {where} empty; the method declares {_declared(spec)}")
            continue
        if not carried:
            raise InputsError(f"the outputs file gives {where} as {describe_value(v)}; the method declares "
                              f"{_declared(spec)}, which an outputs file cannot carry")
        if spec.kind == "tensor":
            if not isinstance(v, TensorInput):
                raise InputsError(f"the outputs file gives {where} as {describe_value(v)}; the method declares {_declared(spec)}")
            if v.scalar_type != spec.scalar_type:
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  f"(dtype {scalar_name(v.scalar_type)} is not {scalar_name(spec.scalar_type)})")
            if len(v.sizes) != len(spec.sizes):
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  f"({len(v.sizes)} dimensions, not {len(spec.sizes)})")
            if spec.dynamism == STATIC and tuple(v.sizes) != spec.sizes:
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  "(the shape differs and the method's shape is static)")
            if spec.dynamism == DYNAMIC_BOUND and any(a > b for a, b in zip(v.sizes, spec.sizes)):
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  "(a dimension exceeds its upper bound)")
        else:
            kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else \
                "double" if isinstance(v, float) else "tensor"
            if kind != spec.kind:
                raise InputsError(f"the outputs file gives {where} as {describe_value(v)}; the method declares "
                                  f"{'an' if spec.kind == 'int' else 'a'} {spec.kind}")


def _declared(spec: InputSpec) -> str:
    """An output's declaration: its dtype and shape, or its kind (an output's exported value is not
    its declaration)."""
    return str(spec) if spec.kind == "tensor" else spec.kind


def _dtype_hint(code: int) -> str:
    if code == 15:
        return " (in an .npz, give bfloat16 as uint16 bit patterns under a key such as '0.bfloat16')"
    if code in NUMPY_NAMES:
        return f" (in an .npz that is numpy {NUMPY_NAMES[code]})"
    return ""
