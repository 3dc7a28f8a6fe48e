"""GPU kind names: one short lowercase word per model, so jobs and workers speak the same language.

A device's marketing name ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Apple M2 Pro")
becomes a *kind* ("h100", "a100", "m2"); memory is a separate fact on the device, never part of the
kind. A job may still write a memory suffix ("a100-80gb"): ``parse_kind`` splits it into the kind
and a minimum memory, which the scheduler applies to that choice only. The same parser reads
``--simulate-kind``.
"""

from __future__ import annotations

import re

GIB = 1 << 30

# Datacenter and workstation parts, matched as whole words of the lowercased name. Longer names
# first so "l40s" is not read as "l40" and "a10g" not as "a10".
_NVIDIA_MODELS = (
    "gb200",
    "gh200",
    "b200",
    "b100",
    "h200",
    "h100",
    "h800",
    "h20",
    "a100",
    "a800",
    "a40",
    "a30",
    "a10g",
    "a10",
    "a16",
    "a2",
    "l40s",
    "l40",
    "l4",
    "t4",
    "v100",
    "p100",
    "p40",
    "p4",
    "k80",
)
_NVIDIA_RE = re.compile(r"(?<![a-z0-9])(" + "|".join(_NVIDIA_MODELS) + r")(?![a-z0-9])")
_RTX_PRO_RE = re.compile(r"\brtx\s*(a\d{4})\b")  # "RTX A6000" -> "a6000"
_RTX_RE = re.compile(r"\brtx\s*(\d{4})(?:\s*(ti|super))?(?:\s*(ada))?\b")  # "RTX 4090" -> "rtx4090"
_APPLE_RE = re.compile(r"\b(m\d+)\b")  # "Apple M2 Pro" -> "m2"
_AMD_RE = re.compile(r"\b(mi\d+[a-z]?)\b")  # "AMD Instinct MI300X" -> "mi300x"
_MEMORY_SUFFIX_RE = re.compile(r"^(?P<kind>.+?)[-_ ](?P<size>\d+(?:\.\d+)?)\s*(?:gb|gib)$")
_SLUG_RE = re.compile(r"[^a-z0-9]+")
_PREFIXES = ("nvidia ", "tesla ", "geforce ", "quadro ", "amd ", "radeon ", "apple ", "instinct ")


def normalize_kind(name: str, vendor: str | None = None) -> str:
    """The kind of a device given its reported name: ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``.

    Unknown names fall back to a slug of the name without vendor words, so a new model still gets a
    stable kind ("NVIDIA Foo 9000" -> "foo-9000") and a job can ask for it by that word.
    """
    text = " ".join(name.lower().replace("_", " ").split())
    if vendor == "sim":
        return parse_kind(text)[0]
    if vendor in (None, "nvidia"):
        m = _RTX_PRO_RE.search(text)
        if m:
            return m.group(1)
        m = _RTX_RE.search(text)
        if m:
            return "rtx" + "".join(g for g in m.groups() if g)
        m = _NVIDIA_RE.search(text)
        if m:
            return m.group(1)
    if vendor in (None, "apple"):
        m = _APPLE_RE.search(text)
        if m and (vendor == "apple" or "apple" in text):
            return m.group(1)
    if vendor in (None, "amd"):
        m = _AMD_RE.search(text)
        if m:
            return m.group(1)
    while True:
        for prefix in _PREFIXES:
            if text.startswith(prefix):
                text = text[len(prefix) :]
                break
        else:
            break
    slug = _SLUG_RE.sub("-", text).strip("-")
    return slug or "unknown"


def parse_kind(spec: str) -> tuple[str, int | None]:
    """Split a kind as a person writes it into ``(kind, minimum memory in bytes or None)``.

    ``"a100-80gb"`` -> ``("a100", 80 GiB)``; ``"H100"`` -> ``("h100", None)``;
    ``"NVIDIA A100-SXM4-40GB"`` -> ``("a100", 40 GiB)``; ``"sim"`` -> ``("sim", None)``. The memory
    suffix needs a separator ("a100-80gb", "a100 80gb") so "a10g" stays a kind.
    """
    text = " ".join(spec.strip().lower().split())
    memory: int | None = None
    m = _MEMORY_SUFFIX_RE.match(text)
    if m:
        memory = int(float(m.group("size")) * GIB)
        text = m.group("kind").rstrip("-_ ")
    if text in ("sim", "cpu"):
        return text, memory
    return normalize_kind(text), memory


def format_bytes(n: int) -> str:
    """Human size for explanations: ``85899345920`` -> ``"80 GiB"``."""
    if n >= GIB:
        value = n / GIB
        return f"{value:.0f} GiB" if value >= 10 or value.is_integer() else f"{value:.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"
