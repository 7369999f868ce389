"""The ``count-params`` table, and the abbreviations other reports share (:func:`human`,
:func:`human_bytes`, ...)."""

from __future__ import annotations

from typing import Any, Sequence


def _scaled(n: float, units: tuple[tuple[float, str], ...], after: str) -> str:
    """``n`` in the largest of ``units`` it reaches, three significant digits (one decimal from 10
    on)."""
    for div, unit in units:
        if abs(n) >= div:
            x = n / div
            return f"{x:.1f}{unit}{after}" if abs(x) >= 10 else f"{x:.2f}{unit}{after}"
    return f"{n:g} {after}" if after else f"{n:g}"  # below the smallest unit: '512', '5 FLOP'


def human(n: float) -> str:
    """Abbreviate a count: 124439808 -> '124.4M', 2362368 -> '2.36M'; k, M, B, T."""
    return _scaled(n, ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")), "")


def human_flops(n: float) -> str:
    """FLOP counts with SI prefixes: 1.89e8 -> '189.0 MFLOP'."""
    return _scaled(
        n,
        (
            (1e21, " Z"),
            (1e18, " E"),
            (1e15, " P"),
            (1e12, " T"),
            (1e9, " G"),
            (1e6, " M"),
            (1e3, " k"),
        ),
        "FLOP",
    )


def human_bytes(n: float) -> str:
    """Bytes in binary units: 1536 -> '1.50 KiB'."""
    for div, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def format_report(rep: dict[str, Any], title: str, overrides: Sequence[str] = ()) -> str:
    """Render a :func:`minigpt_cli.accounting.params.report` dict as a plain-text table for the
    terminal, headed by ``title`` (a preset name or a config path) and the ``--set`` ``overrides``
    that changed it."""
    m = rep["model"]
    pl = rep["per_layer"]
    total = rep["total"]
    L = rep["n_layer"]
    w = 52  # label column: the longest label and a space

    def line(label: str, n: float, abbrev: str, tail: str = "") -> str:
        return f"{label:<{w}}{int(n):>28,}  {abbrev:>11}{('  ' + tail) if tail else ''}"

    def row(label: str, n: int, note: str = "") -> str:
        return line(label, n, human(n), f"{100 * n / total:6.2f}%" + (f"  {note}" if note else ""))

    def lrow(label: str, n: int) -> str:
        return line(label, n, human(n), f"{100 * n / pl['total']:6.2f}% of a layer")

    kv = f", {m['n_kv_head']} KV heads" if m["n_kv_head"] != m["n_head"] else ""
    pos_note = "" if m["pos_encoding"] == "learned" else f"({m['pos_encoding']}: no parameters)"
    switches = [name for name in ("qk_norm", "zero_init_proj", "value_embeddings") if m[name]]
    switches += [f"logit_softcap {m['logit_softcap']:g}"] if m["logit_softcap"] is not None else []
    if overrides:
        title = f"{title} (with overrides: {', '.join(overrides)})"
    lines = [
        f"{title}: {total:,} parameters ({human(total)})",
        f"V={m['vocab_size']:,}  d={m['n_embd']:,}  L={L}  heads={m['n_head']}{kv}  "
        f"d_ff={m['d_ff']:,}  block={m['block_size']:,}",
        f"{m['norm']} ({m['norm_position']}-norm), {m['ffn']}, {m['pos_encoding']} positions, "
        f"bias {'on' if m['bias'] else 'off'}, {'tied' if m['tie_weights'] else 'untied'} lm_head"
        + "".join(f", {name}" for name in switches),
        "",
        f"{'parameters':<{w}}{'count':>28}  {'':>11}  share",
        row("token embedding (wte, V·d)", rep["token_embedding"]),
        row("position embedding (wpe, block·d)", rep["position_embedding"], pos_note),
        *(
            [row("value embeddings (V·n_kv_head·head_dim per table)", rep["value_embedding"])]
            if rep["value_embedding"]
            else []
        ),
        row(
            f"{L} layers × {pl['total']:,}" + (" + value gates" if rep["value_gate"] else ""),
            rep["layers"],
        ),
        lrow("  attention (Q, K, V, O)", pl["attention"]),  # then one row per projection
        *(lrow(f"    {name}", pl[f"attn_{name.lower()}"]) for name in "QKVO"),
        lrow("    of which biases", pl["attention_bias"]),
        lrow(f"  feed-forward ({m['ffn']})", pl["ffn"]),
    ]
    if pl["ffn_w3"]:  # Llama's names: w2(silu(w1·x) * w3·x)
        lines += [lrow("    W1 (gate)", pl["ffn_w1"]), lrow("    W3 (up)", pl["ffn_w3"])]
    else:
        lines.append(lrow("    W1 (up)", pl["ffn_w1"]))
    lines += [
        lrow("    W2 (down)", pl["ffn_w2"]),
        lrow("    of which biases", pl["ffn_bias"]),
        lrow("  2 norms" + (" + q/k norms" if pl["qk_norm"] else ""), pl["norms"]),
        row(
            "final norm",
            rep["final_norm"],
            "" if m["norm_position"] == "pre" else "(post-norm: none)",
        ),
        row("lm_head (V·d)", rep["lm_head"], "(tied to wte)" if rep["tied"] else ""),
        row("total", total),
        row("total without position table (nanoGPT's count)", rep["total_without_positions"]),
        row("embedding (wte, wpe, value emb., untied lm_head)", rep["embedding"]),
        row("non-embedding N (Kaplan et al. 2020)", rep["non_embedding"]),
        row("  weight matrices only (exact)", rep["non_embedding_matrices"]),
        row("  Kaplan's approximation 12·L·d²", rep["kaplan_approximation"]),
    ]

    fl = rep["flops"]
    lines += [
        "",
        f"FLOPs per token at T={rep['seq_len']:,} (Kaplan et al. 2020, Table 1: 2N + 2·L·T·d)",
        line("  dense, 2N", fl["dense_forward"], human_flops(fl["dense_forward"])),
        line(
            "  attention, 2·L·T·d",
            fl["attention_forward"],
            human_flops(fl["attention_forward"]),
            f"{100 * fl['attention_share']:.1f}% of forward",
        ),
        line("forward", fl["forward"], human_flops(fl["forward"])),
        line("training (3× forward, ≈ 6N)", fl["train"], human_flops(fl["train"])),
        line(
            "  lm_head 2·V·d (not in Kaplan's C)",
            fl["lm_head_forward"],
            human_flops(fl["lm_head_forward"]),
        ),
        line(
            "  training with lm_head",
            fl["train_with_lm_head"],
            human_flops(fl["train_with_lm_head"]),
        ),
        line(
            "  6(N+V·d) + 12·L·d·T (PaLM app. B, MFU)",
            fl["mfu_train"],
            human_flops(fl["mfu_train"]),
        ),
    ]
    if "training_flops" in rep:
        lines.append(
            line(
                f"training on D={human(rep['tokens'])} tokens (per token × D)",
                rep["training_flops"],
                human_flops(rep["training_flops"]),
                f"{rep['training_flops']:.3e}",
            )
        )
    lines.append(
        line(
            "Chinchilla-optimal tokens (20 per parameter)",
            rep["chinchilla_tokens"],
            human(rep["chinchilla_tokens"]),
        )
    )

    lines += ["", "FLOPs per token of each matrix (forward 2·in·out, backward 4·in·out)"]
    for name, m in rep["linear_flops_per_token"].items():
        lines.append(
            f"  {name:<12} {m['in']:>7,} × {m['out']:<7,}  forward {m['forward']:>15,}  "
            f"backward {m['backward']:>15,}"
        )

    mem = rep["memory"]
    lines += [
        "",
        f"training memory with {'Muon and AdamW' if mem['optimizer'] == 'muon' else 'AdamW'}, "
        f"{mem['dtype']}{' mixed precision' if mem['mixed_precision'] else ''}, "
        f"batch {mem['batch_size']} × T={mem['seq_len']:,}",
        line("  weights", mem["weights"], human_bytes(mem["weights"])),
        line("  gradients", mem["gradients"], human_bytes(mem["gradients"])),
    ]
    if mem["master_weights"]:
        lines.append(
            line(
                "  float32 master weights",
                mem["master_weights"],
                human_bytes(mem["master_weights"]),
            )
        )
    lines += [
        line("  Adam moments (2 × float32)", mem["adam_moments"], human_bytes(mem["adam_moments"])),
        *(
            [
                line(
                    "  Muon momentum (1 × float32)",
                    mem["muon_momentum"],
                    human_bytes(mem["muon_momentum"]),
                )
            ]
            if mem["muon_momentum"]
            else []
        ),
        line("model states", mem["model_states"], human_bytes(mem["model_states"])),
        line(
            "activations, estimate (Korthikanti et al. 2022)",
            mem["activations_estimate"],
            human_bytes(mem["activations_estimate"]),
        ),
        line(
            "  with fused attention (no s² scores)",
            mem["activations_estimate_fused"],
            human_bytes(mem["activations_estimate_fused"]),
        ),
        line("logits (float32)", mem["logits"], human_bytes(mem["logits"])),
        line("total, estimate", mem["total_estimate"], human_bytes(mem["total_estimate"])),
    ]
    return "\n".join(lines)
