"""The adversarial suite on SmolLM2-135M-Instruct (the slow tier; test_auto_align.py runs it on tiny inits): every
combination of basis {kept, permuted, rotated with gains folded} × vocabulary {kept, renamed, renamed with 16 tokens
added} × weights {as they are, 4-bit, a short fine-tune} is related under compare's default, and the same disguise
of a random init of SmolLM2's shape is not; so are a width-pruned copy, a copy with a trimmed vocabulary and a copy
whose residual is scaled, then moved into another basis and renamed, each against the same shape of a random init.

The 27 combinations take about 8 minutes of one core, so each TL version has its share: TL 4 the kept basis and the
rotated, renamed model as it is (the disguise the issue opened with), TL 3 the permuted and rotated bases. CI runs the
TL 4 share alone (.ci/run ignores this file on TL 3 to keep the two suites side by side about as long); the TL 3
share runs where the file is run under TL 3. What differs between the two TL versions (the edits on a
bridge and on a HookedTransformer, the fingerprints) is tested on both with every combination on tiny inits
(test_auto_align.py); what SmolLM2 adds, its 49,152 real embedding rows, is the same on both.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch

from lens_bias import seedprint as sp
from lens_bias.core.inputs import text_tokens
from lens_bias.models.huggingface import from_hf
from lens_bias.models.reparametrise import permute_residual, rename_vocabulary, rotate_residual, scale_residual
from lens_bias.models.transforms import quantize, random_inits
from lens_bias.models.trim import trim_vocabulary
from lens_bias.models.width import prune_residual

from ..conftest import BACKEND

pytestmark = pytest.mark.slow

# n 64 of 4 tokens (compare's m 0.1·D: k = 57 identity dims): a related pair keeps τ̄ near 1 (0.5 and more after 4-bit
# or the fine-tune), far beyond p < 1e-10's τ̄ > 6.5 · sd(τ) / √k = 6.5 · 0.086 / √57 = 0.074; unrelated models stay
# near 0. The maps, not the fingerprints, are under test, and they read all 49k rows whatever n is.
SIZES = dict(n=64, seq_len=4, progress=False)
BASES = {"kept": lambda m: m, "permuted": lambda m: permute_residual(m, seed=2), "rotated": lambda m: rotate_residual(m, seed=2)}
VOCABS = ("kept", "renamed", "renamed + 16")
WEIGHTS = ("as they are", "4-bit", "fine-tuned")
COMBINATIONS = list(itertools.product(BASES, VOCABS, WEIGHTS))
# this TL version's share (above); SmolLM2 against an unedited copy of itself is left to the real-model tests, to pay
# for the trimmed and scaled copies below
HERE = ([c for c in COMBINATIONS if (c[0] == "kept" and c != ("kept", "kept", "as they are")) or c == ("rotated", "renamed", "as they are")]
        if BACKEND == "bridge" else [c for c in COMBINATIONS if c[0] != "kept"])


def _fine_tuned(hf: Any, tokenizer: Any) -> Any:
    """A copy of ``hf`` after 8 AdamW steps (lr 1e-4, batches of 4 × 32 tokens) on held-out prose."""
    tuned = copy.deepcopy(hf).train()
    tokens = text_tokens(tokenizer, 32, 32, seed=11)
    optimizer = torch.optim.AdamW(tuned.parameters(), lr=1e-4)
    for batch in tokens.split(4):
        optimizer.zero_grad()
        tuned(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
    return tuned.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def starts(smollm2: Any, smollm2_hf: tuple[Any, Any]) -> dict[tuple[str, bool], Any]:
    """The TL models each combination starts from, keyed by (weights before quantisation, 16 tokens added)."""
    hf, tokenizer = smollm2_hf
    tuned = _fine_tuned(hf, tokenizer)

    def grown(model: Any) -> Any:
        model = copy.deepcopy(model)
        model.resize_token_embeddings(model.config.vocab_size + 16)
        return from_hf(model, tokenizer)

    return {("base", False): smollm2, ("base", True): grown(hf), ("tuned", False): from_hf(copy.deepcopy(tuned), tokenizer), ("tuned", True): grown(tuned)}


def _disguised(model: Any, basis: str, vocab: str) -> Any:
    edited = BASES[basis](model)
    return edited if vocab == "kept" else rename_vocabulary(edited, seed=3)


@pytest.fixture(scope="module")
def moved(starts: dict[tuple[str, bool], Any]) -> Any:
    """Each start in a basis, made once and kept while the tests of that basis run (they run basis by basis), so
    that at most four moved copies of a 135M model are held at a time."""
    held: dict[str, dict[tuple[str, bool], Any]] = {}

    def get(basis: str, start: tuple[str, bool]) -> Any:
        if basis not in held:
            held.clear()
            held[basis] = {}
        if start not in held[basis]:
            held[basis][start] = BASES[basis](starts[start])
        return held[basis][start]

    return get


@pytest.fixture(scope="module")
def control(starts: dict[tuple[str, bool], Any]) -> Any:
    """compare's result for a random init of SmolLM2's shape under a disguise, computed once per disguise."""
    inits: dict[bool, Any] = {}
    done: dict[tuple[str, str], Any] = {}

    def get(basis: str, vocab: str) -> Any:
        added = vocab == "renamed + 16"
        if added not in inits:
            inits[added] = next(random_inits(starts[("base", added)], [1_000_000]))
        if (basis, vocab) not in done:
            done[(basis, vocab)] = sp.compare(starts[("base", False)], _disguised(inits[added], basis, vocab), **SIZES)
        return done[(basis, vocab)]

    return get


@pytest.mark.parametrize("basis, vocab, weights", HERE)
def test_every_combination_of_edits_is_found_and_the_control_is_not(smollm2, moved, control, basis, vocab, weights):
    suspect = moved(basis, ("tuned" if weights == "fine-tuned" else "base", vocab == "renamed + 16"))
    suspect = suspect if vocab == "kept" else rename_vocabulary(suspect, seed=3)
    if weights == "4-bit":  # after the disguise, as rotation-based quantisation ships it
        suspect = quantize(suspect, 4)
    result = sp.compare(smollm2, suspect, **SIZES)
    assert result.same_lineage and result.log10_p < -10, str(result)
    expected = {"kept": "identity", "permuted": "permutation", "rotated": "orthogonal"}[basis]
    assert result.basis_map == expected or (weights != "as they are" and result.basis_map in ("orthogonal", "linear")), str(result)
    assert result.renamed_vocabulary == (vocab != "kept"), str(result)
    if weights == "as they are":  # the same function in another basis and vocabulary: the maps undo the edits exactly
        assert result.tau_bar > 0.99 and result.token_source == ("same" if vocab == "kept" else "weights"), str(result)
    unrelated = control(basis, vocab)
    assert not unrelated.same_lineage and unrelated.basis_map == "none", str(unrelated)


# A width-pruned SmolLM2 (576 -> 512 channels of the largest weight norm; head_dim kept), alone on TL 4 and after a
# rotation on TL 3 (the file's split): related under compare's default through a partial map, while the same shape of a
# random init of SmolLM2's architecture is unrelated by its tables, with no fingerprint needed.
PRUNED = {"pruned": (lambda m: prune_residual(m, 512), "partial-permutation"),
          "rotated, then pruned": (lambda m: prune_residual(rotate_residual(m, seed=2), 512), "partial-orthogonal")}


@pytest.mark.parametrize("shape", ["pruned"] if BACKEND == "bridge" else ["rotated, then pruned"])
def test_a_width_pruned_copy_is_found_and_its_control_is_not(smollm2, shape):
    edit, kind = PRUNED[shape]
    result = sp.compare(smollm2, edit(smollm2), **SIZES)
    assert result.same_lineage and result.log10_p < -10 and result.basis_map == kind and result.basis_fit < 0.01, str(result)
    unrelated = sp.compare(smollm2, edit(next(random_inits(smollm2, [1_000_001]))), **SIZES)
    assert not unrelated.same_lineage and unrelated.basis_map == "none" and "not a pruning" in unrelated.reason, str(unrelated)


# SmolLM2 with its residual scaled (× 4 on TL 4, × 1/4 on TL 3: the file's split), then rotated (TL 4) or permuted
# (TL 3) and renamed: the same function up to RMSNorm's epsilon, every embedding norm moved by one factor. Related
# under compare's default through a linear basis map (the scale and the rotation in one), with its vocabulary read from
# the rows; the same edits of a random init of SmolLM2's architecture are not.
SCALED = {"scaled, rotated, renamed": lambda m: rename_vocabulary(rotate_residual(scale_residual(m, 4.0), seed=2), seed=3),
          "scaled down, permuted, renamed": lambda m: rename_vocabulary(permute_residual(scale_residual(m, 0.25), seed=2), seed=3)}


@pytest.mark.parametrize("shape", ["scaled, rotated, renamed"] if BACKEND == "bridge" else ["scaled down, permuted, renamed"])
def test_a_scaled_and_disguised_copy_is_found_and_its_control_is_not(smollm2, shape):
    edit = SCALED[shape]
    result = sp.compare(smollm2, edit(smollm2), **SIZES)
    assert result.same_lineage and result.log10_p < -10 and result.basis_map == "linear" and result.token_source == "weights", str(result)
    assert result.renamed_vocabulary and result.tau_bar > 0.9, str(result)
    unrelated = sp.compare(smollm2, edit(next(random_inits(smollm2, [1_000_002]))), **SIZES)
    assert not unrelated.same_lineage and unrelated.basis_map == "none", str(unrelated)


# SmolLM2 with a fifth of its 49,152 tokens removed (the others in order, no tokenizer), then rotated and rounded to
# 4 bits (TL 4), or trimmed alone (TL 3): related under compare's default on the tokens both hold, its partial token map
# read from the rows; the same edits of a random init of SmolLM2's architecture are not.
TRIMMED = {"trimmed, rotated, 4-bit": (lambda m: quantize(rotate_residual(trim_vocabulary(m, 0.2, seed=1), seed=2), 4), "orthogonal"),
           "trimmed": (lambda m: trim_vocabulary(m, 0.2, seed=1), "identity")}


@pytest.mark.parametrize("shape", ["trimmed, rotated, 4-bit"] if BACKEND == "bridge" else ["trimmed"])
def test_a_copy_with_a_trimmed_vocabulary_is_found_and_its_control_is_not(smollm2, shape):
    edit, kind = TRIMMED[shape]
    suspect = edit(smollm2)
    result = sp.compare(smollm2, suspect, **SIZES)
    assert result.same_lineage and result.log10_p < -10 and result.basis_map == kind and result.token_source == "weights", str(result)
    assert result.tables is not None and result.tables.rows > 0.99 * suspect.W_E.shape[0], str(result)  # nearly every kept token mapped
    unrelated = sp.compare(smollm2, edit(next(random_inits(smollm2, [1_000_003]))), **SIZES)
    assert not unrelated.same_lineage and unrelated.basis_map == "none", str(unrelated)
