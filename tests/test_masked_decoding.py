"""Masked decoding: the pure functions against brute force, and the fairseq search on a scripted decoder.

The scripted-decoder cases give the decoder's distribution after every prefix; each expected
hypothesis and score below is worked out by hand from those numbers in the comments.
"""
from __future__ import annotations

import itertools
import re
import math
import zlib
from argparse import Namespace

import pytest
import torch

pytest.importorskip("fairseq")

import scripted_model  # noqa: E402
from conftest import logged  # noqa: E402
from fairseq import utils  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402
from fairseq.search import BeamSearch  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402
from fairseq.token_generation_constraints import pack_constraints  # noqa: E402

from sparse_softmax.decoding import TokenSets, restrict, source_vocab, support  # noqa: E402
from user_dir.search import MaskedBeamSearch  # noqa: E402
from user_dir.tasks.sparse_seq2seq import SparseSeq2SeqConfig, SparseSeq2SeqTask  # noqa: E402

NEG_INF = -math.inf


# ---------------------------------------------------------------- pure functions vs brute force


def _brute_support(lp: list[float], k: int, allowed: list[bool] | None) -> tuple[set[int], float]:
    ok = [i for i in range(len(lp)) if allowed is None or allowed[i]]
    ranked = sorted(ok, key=lambda i: -lp[i])
    kept = ranked if k == 0 else ranked[:k]
    mass = sum(math.exp(lp[i]) for i in kept)
    return set(kept), math.log(mass)


def _sets(member: torch.Tensor, pad: int, device="cpu") -> TokenSets:
    """TokenSets from a bool membership matrix, padded (with ``pad``) in the order a test chooses."""
    width = int(member.sum(-1).max())
    ids = torch.full((*member.shape[:-1], width), pad)
    offset = torch.full(ids.shape, NEG_INF, dtype=torch.float64)
    for index in itertools.product(*map(range, member.shape[:-1])):
        members = member[index].nonzero().flatten().flip(0)  # any order must do
        ids[index][: len(members)] = members
        offset[index][: len(members)] = 0.0
    return TokenSets(ids.to(device), offset.to(device))


def _kept(got, index) -> set[int]:
    ids = got.ids[index].tolist()
    return set(ids) if got.offset is None else {i for i, o in zip(ids, got.offset[index].tolist()) if o == 0}


@pytest.mark.parametrize("k", [0, 1, 3, 7])
@pytest.mark.parametrize("with_allowed", [False, True])
def test_support_matches_brute_force(k, with_allowed, device):
    torch.manual_seed(k)
    lp = torch.randn(4, 3, 9, dtype=torch.float64).log_softmax(-1).to(device)
    member = torch.rand(4, 1, 9) < 0.5
    member[..., 2] = True  # EOS, as the task always allows it
    member[..., 1] = False  # padding
    allowed = _sets(member, pad=1, device=device) if with_allowed else None
    got = support(lp, k, allowed)
    if allowed is None and k == 0:
        assert got is None
        return
    for b, r in itertools.product(range(4), range(3)):
        row_allowed = member[b, 0].tolist() if with_allowed else None
        kept, log_mass = _brute_support(lp[b, r].tolist(), k, row_allowed)
        assert _kept(got, (b, r)) == kept
        assert got.log_mass[b, r, 0].item() == pytest.approx(log_mass, abs=1e-12)


def test_support_is_none_when_nothing_is_masked():
    lp = torch.randn(2, 5).log_softmax(-1)
    assert support(lp, 5) is None and support(lp, 50) is None
    with pytest.raises(ValueError, match="k must be >= 0"):
        support(lp, -1)


def _brute_restrict(lp, edited, kept: set[int], log_mass: float, allowed: set[int] | None, fill: float):
    finite = {i for i, x in enumerate(edited) if x > NEG_INF}
    usable = kept & finite
    if not usable:  # rescue: allowed tokens the generator left, else any it left
        usable = (finite & allowed) if allowed is not None and finite & allowed else finite
    return [edited[i] - log_mass if i in usable else (fill if i in finite else NEG_INF) for i in range(len(lp))]


@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("fill", [NEG_INF, -1e4])
@pytest.mark.parametrize("with_allowed", [False, True])
def test_restrict_matches_brute_force(k, fill, with_allowed, device):
    torch.manual_seed(10 + k)
    lp = torch.randn(5, 2, 8, dtype=torch.float64).log_softmax(-1)
    edited = lp.clone()
    edited[..., 1] = NEG_INF  # padding
    edited[edited < -2.6] = NEG_INF  # the generator's bans, some rows lose every kept token
    edited[0, 0, :] = NEG_INF
    edited[0, 0, 6] = lp[0, 0, 6]  # a row where only one token is left (EOS at max length)
    member = torch.rand(5, 1, 8) < 0.4
    member[..., 2], member[..., 1] = True, False
    member[1, 0, 3:6] = True
    row_allowed = member[1, 0].nonzero().flatten()
    least = row_allowed[lp[1, 0, row_allowed].argmin()]
    edited[1, 0] = lp[1, 0]
    edited[1, 0, row_allowed[row_allowed != least]] = NEG_INF  # the top allowed tokens are banned, not all
    edited[1, 0, 1] = NEG_INF
    allowed = _sets(member, pad=1, device=device) if with_allowed else None
    kept = support(lp.to(device), k, allowed)
    if k == 0 and not with_allowed:  # nothing to restrict: the search leaves the scores as they are
        assert kept is None
        return
    got = restrict(edited.to(device), kept, allowed, fill)
    for b, r in itertools.product(range(5), range(2)):
        row_allowed = set(member[b, 0].nonzero().flatten().tolist()) if with_allowed else None
        want = _brute_restrict(lp[b, r].tolist(), edited[b, r].tolist(), _kept(kept, (b, r)),
                               kept.log_mass[b, r, 0].item(), row_allowed, fill)
        assert got[b, r].tolist() == pytest.approx(want, abs=1e-12), (b, r)


def test_padding_entries_of_token_sets_are_never_kept():
    # sets of different sizes: row 0 is {2, 3}, padded with id 1; even where the scores at id 1 are
    # finite (fairseq always sets them to -inf), the padding entry is neither kept nor counted
    allowed = TokenSets(torch.tensor([[2, 3, 1], [2, 3, 4]]), torch.tensor([[0.0, 0.0, NEG_INF], [0.0, 0.0, 0.0]]))
    lp = torch.full((2, 5), math.log(0.2))
    kept = support(lp, 0, allowed)
    assert kept.log_mass[:, 0].tolist() == pytest.approx([math.log(0.4), math.log(0.6)])
    out = restrict(lp, kept, allowed)
    assert out[0].tolist() == pytest.approx([NEG_INF, NEG_INF, math.log(0.5), math.log(0.5), NEG_INF])


def test_restrict_renormalises_kept_and_respects_generator_edits():
    lp = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]], dtype=torch.float64)
    kept = support(lp, 2)
    edited = lp.clone()
    edited[0, 1] = NEG_INF  # the generator forbade token 1 (e.g. n-gram blocking)
    for fill in (NEG_INF, -1e4):
        out = restrict(edited, kept, fill=fill)
        assert out[0, 0].item() == pytest.approx(math.log(0.5 / 0.8))  # mass of the top 2 stays 0.8
        assert out[0, 1].item() == NEG_INF  # a generator -inf is never filled
        assert out[0, 2].item() == fill  # masked


def test_source_vocab(device):
    src = torch.tensor([[1, 1, 5, 4, 2], [6, 6, 6, 4, 2]], device=device)  # pad=1, eos=2
    got = source_vocab(src, 8, pad=1, always_allowed=[2, 7])
    assert got.ids.tolist() == [[2, 4, 5, 7], [2, 4, 6, 7]] and (got.offset == 0).all()
    # separate dictionaries: source id 5 has no target symbol (mapped to pad), 4 -> 3, 6 -> 5
    src_to_tgt = torch.tensor([0, 1, 2, 3, 3, 1, 5], device=device)
    got = source_vocab(src[:, 2:], 8, pad=1, always_allowed=[2], src_to_tgt=src_to_tgt)
    assert got.ids.tolist() == [[2, 3, 1], [2, 3, 5]]
    assert got.offset.tolist() == [[0, 0, NEG_INF], [0, 0, 0]]


# ---------------------------------------------------------------- the search on a scripted decoder

D = scripted_model.dictionary()
V = len(D)


def _task(**options) -> SparseSeq2SeqTask:
    return SparseSeq2SeqTask(SparseSeq2SeqConfig(**options), D, D)


def _decode(script, sources, task_options=None, prefix=None, device="cpu", search=None, forced=None, **generation):
    """[[(symbols, positional scores, score), ...best first] per source], decoded on ``device``; with ``search`` (a
    subclass of the task's search class), by that class in place of the task's; ``forced``: packed lexical
    constraints for ``constraints=...`` searches."""
    task = _task(**(task_options or {}))
    model = scripted_model.model(D, script).to(device)
    args = Namespace(**{"beam": 2, "unnormalized": True, "max_len_b": 10, **generation})
    generator = task.build_generator([model], args)
    if search is not None:
        assert isinstance(generator.search, search.__base__)
        generator.search.__class__ = search  # this generator's search only, its state as the task made it
    sample = utils.apply_to_sample(lambda t: t.to(device), scripted_model.sample(D, sources))
    prefix, forced = (x.to(device) if x is not None else None for x in (prefix, forced))
    hypos = task.inference_step(generator, [model], sample, prefix_tokens=prefix, constraints=forced)
    return [
        [(tuple(D[t] for t in h["tokens"].tolist()), h["positional_scores"].tolist(), h["score"].item()) for h in hs]
        for hs in hypos
    ]


def _ranking_script(src, prefix):
    return {
        (): {"a": 0.5, "b": 0.4, "c": 0.1},
        ("a",): {"</s>": 0.32, "c": 0.30, "d": 0.28, "e": 0.10},
        ("b",): {"</s>": 0.45, "c": 0.44, "f": 0.11},
    }.get(prefix, {"</s>": 1.0})


def test_plain_beam_on_the_ranking_script(device):
    # beam 2: step 0 keeps a (.5), b (.4). Step 1 candidates: b</s> .18, bc .176, a</s> .16, ac .15;
    # b</s> is finalised, bc and ac go on and end with </s> (p=1): bc</s> .176 completes the beam.
    (hyps,) = _decode(_ranking_script, ["a"], device=device)
    assert [h[0] for h in hyps] == [("b", "</s>"), ("b", "c", "</s>")]
    assert hyps[0][1] == pytest.approx([math.log(0.4), math.log(0.45)], abs=1e-6)
    assert hyps[0][2] == pytest.approx(math.log(0.18), abs=1e-6)


def test_topk_renormalisation_changes_the_ranking(device):
    # K=2: step 0 keeps {a, b} (mass .9). After a the top 2 are {</s> .32, c .30} (mass .62), after b
    # {</s> .45, c .44} (mass .89): a</s> = .5/.9*.32/.62 = .2867 beats b</s> = .4/.9*.45/.89 = .2247.
    # Candidates a</s>, ac (.2688), b</s>, bc: a</s> is finalised, ac</s> (p=1 after ac) completes the beam.
    (hyps,) = _decode(_ranking_script, ["a"], {"decoding_topk": 2}, device=device)
    assert [h[0] for h in hyps] == [("a", "</s>"), ("a", "c", "</s>")]
    assert hyps[0][1] == pytest.approx([math.log(0.5 / 0.9), math.log(0.32 / 0.62)], abs=1e-6)
    assert hyps[1][1] == pytest.approx([math.log(0.5 / 0.9), math.log(0.30 / 0.62), 0.0], abs=1e-6)
    assert hyps[0][2] == pytest.approx(math.log(0.5 / 0.9 * 0.32 / 0.62), abs=1e-6)


def _random_script(src, prefix):
    """A fixed random distribution per (source, prefix); longer prefixes end more often."""
    seed = zlib.crc32(repr((src, prefix)).encode())
    logits = torch.randn(V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    logits[D.eos()] += len(prefix) - 2
    logits[[D.bos(), D.pad()]] = -math.inf
    return {D[i]: p for i, p in enumerate(logits.softmax(-1).tolist()) if p > 0}


def test_topk_at_least_vocab_is_plain_beam_search_exactly(device):
    sources = ["a b c", "d e", "f"]
    for options in ({"beam": 3, "nbest": 3}, {"beam": 5, "lenpen": 1.3, "unnormalized": False}):
        plain = _decode(_random_script, sources, device=device, **options)
        for k in (V, V + 7):
            assert _decode(_random_script, sources, {"decoding_topk": k}, device=device, **options) == plain
        assert _decode(_random_script, sources, {"decoding_topk": 3}, device=device, **options) != plain


class _ReferenceSearch(MaskedBeamSearch):
    def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None, multiple=2):
        """The masked beam step as restrict() + fairseq's own BeamSearch.step over the whole vocabulary."""
        kept, self._support = self._support, None
        if kept is not None:
            lprobs = restrict(lprobs, kept, self._allowed, self.fill)
        return BeamSearch.step(self, step, lprobs, scores, prev_output_tokens, original_batch_idxs, multiple)


@pytest.mark.parametrize("beam", [1, 3, 5])
@pytest.mark.parametrize("options", [{"decoding_topk": 1}, {"decoding_topk": 2}, {"decoding_topk": 4},
                                     {"source_vocab_mask": True}, {"decoding_topk": 2, "source_vocab_mask": True}])
def test_candidates_drawn_from_the_support_equal_fairseqs_beam_step(beam, options):
    sources = ["a b c", "d e", "f", "a c e f"]
    fast = _decode(_random_script, sources, options, beam=beam, nbest=beam, max_len_b=6)
    assert _decode(_random_script, sources, options, beam=beam, nbest=beam, max_len_b=6,
                   search=_ReferenceSearch) == fast


def _source_script(src, prefix):
    return {
        (): {"a": 0.6, "b": 0.3, "c": 0.1},
        ("b",): {"</s>": 0.5, "a": 0.4, "c": 0.1},
    }.get(prefix, {"</s>": 1.0})


def test_source_vocab_mask_restricts_and_renormalises(device):
    # source "b c": allowed {b, c, </s>}. Step 0 renormalises over {b .3, c .1}: b .75, c .25.
    # After b: allowed {</s> .5, c .1} (a is not in the source): b</s> = .75*.5/.6 = .625, bc = .125;
    # after c: </s> = 1, c</s> = .25. Beam 2 finalises b</s> and c</s>.
    (hyps,) = _decode(_source_script, ["b c"], {"source_vocab_mask": True}, device=device)
    assert [h[0] for h in hyps] == [("b", "</s>"), ("c", "</s>")]
    assert [h[2] for h in hyps] == pytest.approx([math.log(0.625), math.log(0.25)], abs=1e-6)
    # plain beam search prefers a, which is not in the source
    assert _decode(_source_script, ["b c"], device=device)[0][0][0][0] == "a"
    # --source-vocab-allow a: a is always allowed; after b the mass of {</s>, a, c} is 1
    (hyps,) = _decode(_source_script, ["b c"], {"source_vocab_mask": True, "source_vocab_allow": "a"}, device=device)
    assert hyps[0][0] == ("a", "</s>")


def test_the_task_keeps_both_dictionaries():
    """fairseq-generate prints the source lines by the task's source dictionary."""
    src, tgt = scripted_model.dictionary(), scripted_model.dictionary()
    task = SparseSeq2SeqTask(SparseSeq2SeqConfig(), src, tgt)
    assert task.source_dictionary is src and task.target_dictionary is tgt


def test_a_generator_the_task_did_not_build_is_refused():
    """--source-vocab-mask sets each batch's allowed words on the task's own search: any other generator would
    decode without the mask, so it is refused by name."""
    model = scripted_model.model(D, _source_script)
    with pytest.raises(RuntimeError) as refused:
        _task(source_vocab_mask=True).inference_step(SequenceGenerator([model], D, beam_size=2), [model],
                                                     scripted_model.sample(D, ["b c"]))
    assert str(refused.value) == "--source-vocab-mask needs a generator built by this task's build_generator"


def test_source_vocab_mask_with_topk():
    # K=1 within the source "b c": b (1.0), then the top 1 of {</s> .5, c .1} is </s> (1.0)
    (hyps,) = _decode(_source_script, ["b c"], {"source_vocab_mask": True, "decoding_topk": 1}, beam=1)
    assert hyps == [(("b", "</s>"), [0.0, 0.0], 0.0)]


def test_source_mask_follows_sentences_through_a_batch(device):
    def script(src, prefix):  # every source prefers tokens it does not contain; no </s> before its length
        probs = {s: (i + 1) * (0.05 if s in src else 0.2) for i, s in enumerate(scripted_model.SYMBOLS)}
        probs["</s>"] = 0.0
        probs = {s: p / sum(probs.values()) for s, p in probs.items()}
        if len(prefix) >= len(src):
            probs = {"</s>": 0.5, **{s: p / 2 for s, p in probs.items() if s != "</s>"}}
        return probs

    sources = ["a", "b c d", "e f", "c"]
    options = {"source_vocab_mask": True}
    batched = _decode(script, sources, options, beam=3, nbest=3, device=device)
    assert batched == [_decode(script, [s], options, beam=3, nbest=3, device=device)[0] for s in sources]
    for src, hyps in zip(sources, batched):
        assert len(hyps) == 3
        for symbols, _, _ in hyps:
            assert set(symbols) <= set(src.split()) | {"</s>"}, (src, symbols)


def test_a_source_dictionary_of_its_own_is_mapped_into_target_ids(device):
    """Source and target dictionaries differ (another order, and a source symbol the target lacks): the mask
    allows the target ids of each source's symbols, and the missing symbol allows nothing."""
    src_dictionary = Dictionary()
    for s in ("zz", *reversed(scripted_model.SYMBOLS)):
        src_dictionary.add_symbol(s)
    task = SparseSeq2SeqTask(SparseSeq2SeqConfig(source_vocab_mask=True), src_dictionary, D)

    def uniform(src, prefix):  # every symbol alike; </s> only after two tokens
        symbols = (*scripted_model.SYMBOLS, "</s>") if len(prefix) >= 2 else scripted_model.SYMBOLS
        return {s: 1 / len(symbols) for s in symbols}

    model = scripted_model.model(D, uniform).to(device)
    generator = task.build_generator([model], Namespace(beam=3, nbest=3, unnormalized=True, max_len_b=4))
    sources = ["b c zz", "f", "zz a"]
    sample = utils.apply_to_sample(lambda x: x.to(device), scripted_model.sample(src_dictionary, sources))
    hypos = task.inference_step(generator, [model], sample)
    for source, hyps in zip(sources, hypos, strict=True):
        allowed = set(source.split()) - {"zz"} | {"</s>"}
        for hyp in hyps:
            symbols = {D[t] for t in hyp["tokens"].tolist()}
            assert symbols <= allowed and len(symbols) > 1, (source, symbols)


def test_eos_forced_at_max_length_stays_finite(device):
    # every prefix: a .9, b .09, </s> .01. K=1 keeps only a (renormalised to 1), so the hypothesis
    # cannot end until the maximum length (2) forces </s>, scored on the same scale: log(.01/.9).
    def script(src, prefix):
        return {"a": 0.9, "b": 0.09, "</s>": 0.01}

    for fill in (NEG_INF, -1e4):
        hyps = _decode(script, ["a"], {"decoding_topk": 1, "decoding_mask_fill": fill}, beam=1, max_len_b=2,
                       device=device)
        assert hyps == [[(("a", "a", "</s>"), pytest.approx([0.0, 0.0, math.log(0.01 / 0.9)], abs=1e-6),
                          pytest.approx(math.log(0.01 / 0.9), abs=1e-6))]]


def test_fewer_kept_tokens_than_candidates():
    # K=1 with beam 2: the beam draws 4 candidates per step but only one is kept. With -inf fill the
    # extra beams are dead and never finalised: one hypothesis comes out ("a a </s>", </s> forced at
    # length 2). A finite fill lets the beam fall back on masked tokens: two hypotheses.
    def script(src, prefix):
        return {"a": 0.6, "b": 0.3, "</s>": 0.1}

    (hyps,) = _decode(script, ["a"], {"decoding_topk": 1}, beam=2, nbest=2, max_len_b=2)
    assert [h[0] for h in hyps] == [("a", "a", "</s>")]
    assert hyps[0][2] == pytest.approx(math.log(0.1 / 0.6), abs=1e-6)
    (hyps,) = _decode(script, ["a"], {"decoding_topk": 1, "decoding_mask_fill": -1e4}, beam=2, nbest=2, max_len_b=2)
    assert len(hyps) == 2 and hyps[0][0] == ("a", "a", "</s>") and hyps[1][2] < -1e4 + 1


def test_sentence_whose_hypotheses_all_ended_stops_at_max_length():
    # K=1, beam 3: a, then the only kept token is </s>: "a </s>" is finalised and the two other
    # beams are dead. fairseq would assert at the maximum length; the search stops there instead.
    def script(src, prefix):
        return {(): {"a": 0.6, "b": 0.4}}.get(prefix, {"</s>": 0.7, "b": 0.3})

    (hyps,) = _decode(script, ["a"], {"decoding_topk": 1}, beam=3, nbest=3, max_len_b=4)
    assert hyps == [(("a", "</s>"), [0.0, 0.0], 0.0)]


def test_no_repeat_ngram_blocking_the_kept_token():
    # K=1 keeps a (.9 -> 1). After "a a", --no-repeat-ngram-size 2 blocks a: the row falls back on what
    # the generator leaves, on the renormalised scale: b (.06/.9); after "a a b", </s> has p=1.
    def script(src, prefix):
        return {("a", "a", "b"): {"</s>": 1.0}}.get(prefix, {"a": 0.9, "b": 0.06, "</s>": 0.04})

    (hyps,) = _decode(script, ["a"], {"decoding_topk": 1}, beam=1, no_repeat_ngram_size=2)
    assert hyps[0][0] == ("a", "a", "b", "</s>")
    assert hyps[0][1] == pytest.approx([0.0, 0.0, math.log(0.06 / 0.9), 0.0], abs=1e-6)


def test_min_len_and_unkpen_act_on_the_masked_distribution():
    # K=2 at step 0 keeps {</s> .5, <unk> .3} (mass .8). --min-len 1 forbids </s>; --unkpen 1 lowers
    # <unk> to log(.3/.8) - 1, still the only kept token; after it </s> has p=1.
    def script(src, prefix):
        return {(): {"</s>": 0.5, "<unk>": 0.3, "a": 0.2}}.get(prefix, {"</s>": 1.0})

    (hyps,) = _decode(script, ["a"], {"decoding_topk": 2}, beam=1, unkpen=1.0)
    assert hyps[0][0] == ("<unk>", "</s>")
    assert hyps[0][1] == pytest.approx([math.log(0.3 / 0.8) - 1, 0.0], abs=1e-6)


def test_prefix_tokens_outside_the_mask_are_forced():
    # source "b": allowed {b, </s>}; the prefix forces a (not in the source, not in the top 1).
    # Step 0 scores a on the masked scale: log(.6 / .3) (kept: b .3); then b (only allowed, mass .3 -> 1).
    def script(src, prefix):
        return {(): {"a": 0.6, "b": 0.3, "c": 0.1}, ("a",): {"b": 0.3, "c": 0.7}}.get(prefix, {"</s>": 1.0})

    prefix = torch.tensor([[D.index("a")]])
    (hyps,) = _decode(script, ["b"], {"source_vocab_mask": True, "decoding_topk": 1}, prefix=prefix, beam=1)
    assert hyps[0][0] == ("a", "b", "</s>")
    assert hyps[0][1] == pytest.approx([math.log(0.6 / 0.3), 0.0, 0.0], abs=1e-6)


def test_empty_source_with_min_len():
    # source "": only </s> is allowed, but --min-len 1 forbids it at step 0; the constraint wins and
    # the step is taken over all tokens (best: c .7, renormalised by the kept mass, p(</s>) = .1).
    def script(src, prefix):
        return {(): {"</s>": 0.1, "c": 0.7, "d": 0.2}}.get(prefix, {"</s>": 0.4, "c": 0.6})

    (hyps,) = _decode(script, [""], {"source_vocab_mask": True}, beam=1)
    assert hyps[0][0] == ("c", "</s>")
    assert hyps[0][1] == pytest.approx([math.log(0.7 / 0.1), 0.0], abs=1e-6)


@pytest.mark.parametrize("generation, flags", [
    ({"sampling": True}, "--sampling"),
    ({"diverse_beam_groups": 1}, "--diverse-beam-groups"),
    ({"diversity_rate": 0.0}, "--diversity-rate"),
    ({"match_source_len": True}, "--match-source-len"),
    ({"constraints": "ordered"}, "--constraints"),
    ({"score_reference": True}, "--score-reference"),
    ({"prefix_allowed_tokens_fn": len}, "prefix_allowed_tokens_fn"),
    ({"sampling": True, "score_reference": True}, "--sampling, --score-reference"),
])
def test_other_search_strategies_are_refused(generation, flags):
    """Every search option fairseq-generate would honour instead of the mask, at its smallest value, is named."""
    model = scripted_model.model(D, _ranking_script)
    with pytest.raises(ValueError) as refused:
        _task(decoding_topk=5).build_generator([model], Namespace(beam=2, **generation))
    assert str(refused.value) == (f"--decoding-topk / --source-vocab-mask work with plain beam search, not with "
                                  f"{flags}. For top-k sampling use --sampling --sampling-topk K instead of "
                                  "--decoding-topk.")
    _task().build_generator([model], Namespace(beam=2, **generation))  # without masking: fairseq's own


def _f_script(src, prefix):
    return {(): {"a": 0.5, "b": 0.4, "f": 0.1}, ("a",): {"</s>": 0.6, "f": 0.4},
            ("b",): {"</s>": 0.7, "f": 0.3}}.get(prefix, {"</s>": 1.0})


def test_constraints_reach_fairseqs_constrained_search(device):
    """Without masking the task hands fairseq's own search the lexical constraints: at beam 1, a</s> (.3) unforced,
    f</s> (.1) with f required (the constrained search meets a constraint as soon as it can)."""
    (hyps,) = _decode(_f_script, ["a"], device=device, beam=1)
    assert [h[0] for h in hyps] == [("a", "</s>")]
    forced = pack_constraints([[torch.tensor([D.index("f")])]])
    (hyps,) = _decode(_f_script, ["a"], device=device, forced=forced, beam=1, constraints="ordered")
    assert [h[0] for h in hyps] == [("f", "</s>")]
    assert hyps[0][2] == pytest.approx(math.log(0.1), abs=1e-6)


class _CallersGenerator(SequenceGenerator):
    """A generator class of the caller's own, as fairseq's scorers and hub interface pass one in."""


@pytest.mark.parametrize("options", [{}, {"decoding_topk": 2}])
def test_the_callers_generator_class_and_keywords_reach_fairseq(options):
    c = D.index("c")
    generator = _task(**options).build_generator(
        [scripted_model.model(D, _ranking_script)], Namespace(beam=2), seq_gen_cls=_CallersGenerator,
        extra_gen_cls_kwargs={"symbols_to_strip_from_output": {c}})
    assert type(generator) is _CallersGenerator
    assert c in generator.symbols_to_strip_from_output


def test_a_prefix_function_argument_reaches_fairseqs_search_or_is_refused():
    """Python callers hand ``prefix_allowed_tokens_fn`` to build_generator itself, not in ``args``. Without masking
    it reaches fairseq's prefix-constrained search: with only a, c and </s> allowed, beam 2 keeps a (.5) and c (.1),
    and a</s> (.16) beats ac</s> (.15) and c</s> (.1), where plain beam search finds b</s> (.18)."""
    model = scripted_model.model(D, _ranking_script)
    allowed = [D.index("a"), D.index("c"), D.eos()]
    task = _task()
    generator = task.build_generator([model], Namespace(beam=2, max_len_b=10, unnormalized=True),
                                     prefix_allowed_tokens_fn=lambda batch, prefix: allowed)
    (hyps,) = task.inference_step(generator, [model], scripted_model.sample(D, ["a"]))
    assert [D[t] for t in hyps[0]["tokens"].tolist()] == ["a", "</s>"]
    with pytest.raises(ValueError, match="not with prefix_allowed_tokens_fn"):
        _task(decoding_topk=5).build_generator([model], Namespace(beam=2), prefix_allowed_tokens_fn=len)


def test_the_default_search_options_are_plain_beam_search():
    model = scripted_model.model(D, _ranking_script)
    _task(decoding_topk=5).build_generator([model], Namespace(beam=2, diverse_beam_groups=-1, diversity_rate=-1.0,
                                                              sampling=False, match_source_len=False))


@pytest.mark.parametrize("options, message", [
    ({"decoding_topk": -1}, "--decoding-topk"),
    ({"decoding_mask_fill": 0.0}, "--decoding-mask-fill"),
    ({"source_vocab_allow": "a yy zz"}, f"--source-vocab-allow: not in the target dictionary: yy zz (the dictionary "
                                        f"has {len(D)} symbols)"),
])
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _task(**options)


@pytest.mark.parametrize("options, said", [
    ({"decoding_topk": len(D)}, f"--decoding-topk {len(D)} >= {len(D)} target symbols: no token is masked by it, "
                                "so decoding is plain beam search"),
    ({"decoding_topk": len(D), "source_vocab_mask": True},
     f"--decoding-topk {len(D)} >= {len(D)} target symbols: no token is masked by it, so decoding is "
     "--source-vocab-mask alone"),
    ({"decoding_topk": len(D) - 1}, None),
])
def test_a_topk_that_masks_nothing_is_said_at_start(options, said, caplog):
    with caplog.at_level("WARNING", logger="user_dir.tasks.sparse_seq2seq"):
        _task(**options)
    assert logged(caplog, "user_dir.tasks.sparse_seq2seq") == (
        [said] if said else [])


def test_a_generator_without_the_batch_mask_is_refused():
    task = _task(source_vocab_mask=True)
    model = scripted_model.model(D, _source_script)
    generator = task.build_generator([model], Namespace(beam=2))
    with pytest.raises(RuntimeError, match="no source mask was set"):
        generator.generate([model], scripted_model.sample(D, ["b"]))
