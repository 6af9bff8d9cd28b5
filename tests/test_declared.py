"""Token contracts as data (runtime.declared): seq2onnx's own models as instances, manifests carrying them (format 2)
and still reading format 1; special ids a model declares for itself, in its vocabularies."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from runtime.contract import FORMAT_VERSION, MANIFEST_FILE
from runtime.declared import ContractError, Sources, TokenContract
from runtime.errors import ManifestError
from runtime.model import Seq2Seq
from runtime.spec import ModelSpec, SpecError
from runtime.specials import FIXED, Specials, SpecialsError
from runtime.vocab import VocabError, Vocabulary

from support.models import toy_token_spec

TEXTS = ["one is one", "two is two"]
TUTORIAL = ("SOS", "EOS", "je", "suis", "froid", "il", "est")  # the PyTorch tutorial's layout: SOS 0, EOS 1


def tutorial_vocab() -> Vocabulary:
    return Vocabulary(TUTORIAL, "whitespace", specials=Specials(bos=0, eos=1))


@pytest.mark.parametrize("fields", [dict(), dict(attention="none", cell="lstm"), dict(attention="multihead", n_heads=2),
                                    dict(arch="transformer", d_model=8, d_ff=16, n_heads=2, max_positions=9)])
def test_own_models_are_contracts_that_survive_json(fields):
    spec = toy_token_spec(hidden_dim=8, embedding_dim=6, **fields) if "arch" not in fields else toy_token_spec(**fields)
    contract = TokenContract.for_spec(spec)
    assert TokenContract.from_dict(json.loads(json.dumps(contract.to_dict()))) == contract
    assert contract.specials == FIXED and contract.constant == frozenset(contract.state) - set(contract.feedback.values())
    assert contract.max_decoding_length == (9 if spec.is_transformer else None)


def test_an_export_carries_its_contract_and_format_1_still_loads(recurrent_export, tmp_path):
    manifest = json.loads((recurrent_export.path / MANIFEST_FILE).read_text())
    assert manifest["format_version"] == FORMAT_VERSION == 2
    assert manifest["contract"] == TokenContract.for_spec(ModelSpec.from_dict(manifest["spec"])).to_dict()
    old = tmp_path / "old"
    shutil.copytree(recurrent_export.path, old)
    del manifest["contract"]
    (old / MANIFEST_FILE).write_text(json.dumps({**manifest, "format_version": 1}))
    options = dict(beam_size=3, num_hypotheses=2)
    got = Seq2Seq.load(old).translate_batch(TEXTS, **options)
    want = Seq2Seq.load(recurrent_export.path).translate_batch(TEXTS, **options)
    assert [[t.ids for t in n] for n in got] == [[t.ids for t in n] for n in want]
    assert Seq2Seq.load(old).contract == Seq2Seq.load(recurrent_export.path).contract


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.pop("feedback"), "contract must be an object with exactly"),
    (lambda c: c["feedback"].update(hidden_out="keys"), "step output 'hidden_out' feeds 'keys' back but is"),
    (lambda c: c.update(never=[0]), "differs from the one the spec implies in never;"),
    (lambda c: c["sources"].update(reverse=True), "differs from the one the spec implies in sources;"),  # named
    (lambda c: c["specials"].update(eos=1), "share an id"),
    (lambda c: c["step"]["inputs"]["hidden"].remove("batch"), "exactly one 'batch' dim"),
])
def test_an_edited_contract_is_refused(recurrent_export, tmp_path, edit, message):
    bad = tmp_path / "bad"
    shutil.copytree(recurrent_export.path, bad)
    manifest = json.loads((bad / MANIFEST_FILE).read_text())
    edit(manifest["contract"])
    (bad / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=message):
        Seq2Seq.load(bad)


def test_contract_checks_name_what_is_wrong():
    own = TokenContract.for_spec(toy_token_spec(hidden_dim=8, embedding_dim=6)).to_dict()
    cases = [
        ({**own, "feedback": {"log_probs": "hidden"}}, "step output 'log_probs' feeds 'hidden' back"),
        ({**own, "feedback": {}}, "step outputs \\['hidden_out'\\] feed nothing back"),
        ({**own, "never": [2]}, "never-emitted ids must be target ids other than eos"),
        ({**own, "step": {**own["step"], "inputs": {**own["step"]["inputs"], "extra": ["batch"]}}},
         "state 'extra' is read by the step but the encoder does not make it"),
        ({**own, "sources": {**own["sources"], "fixed_len": 0}}, "sources.fixed_len must be an int >= 1 or None"),
        # a hand edit's typos: Python's own words about a keyword argument, and 'got None' for a renamed output
        ({**own, "sources": {"fixd_len": 10, **{k: v for k, v in own["sources"].items() if k != "fixed_len"}}},
         r"sources has unknown keys \['fixd_len'\]; it takes \['add_bos', 'add_eos', 'fixed_len', 'max_len', "
         r"'reverse'\]"),
        ({**own, "step": {**own["step"], "outputs": {("log_prob" if k == "log_probs" else k): v
                                                     for k, v in own["step"]["outputs"].items()}}},
         r"the step has no output 'log_probs' \(the scores the search reads\); its outputs: \["),
    ]
    for data, message in cases:
        with pytest.raises(ContractError, match=message):
            TokenContract.from_dict(data)


def test_a_fixed_source_length_bounds_the_source():
    assert Sources(fixed_len=10).max_len == 10
    assert Sources(fixed_len=10, max_len=7).max_len == 7


def test_declared_specials_are_checked():
    for bad, message in [(dict(bos=0, eos=0), "share an id"), (dict(bos=-1, eos=1), "'bos' must be an int >= 0"),
                         (dict(bos=0, eos=1, pad=True), "'pad' must be an int >= 0 or None")]:
        with pytest.raises(SpecialsError, match=message):
            Specials(**bad)
    with pytest.raises(VocabError, match="outside the vocabulary, which holds ids 0..1"):
        Vocabulary(("SOS", "EOS"), "whitespace", specials=Specials(bos=0, eos=2))


def test_a_vocabulary_with_its_own_specials_encodes_decodes_and_round_trips(tmp_path):
    vocab = tutorial_vocab()
    assert vocab.encode("je suis froid") == [2, 3, 4, 1]  # closed by its own eos
    ids, lengths = vocab.encode_batch(["je suis froid", "il est"])
    np.testing.assert_array_equal(ids, [[2, 3, 4, 1], [5, 6, 1, 1]])  # no pad id: filled with eos, past lengths
    np.testing.assert_array_equal(lengths, [4, 3])
    assert vocab.decode([2, 3, 1, 4]) == "je suis" and vocab.decode([0, 5, 6]) == "il est"
    with pytest.raises(VocabError, match="token 'chaud' is not in the vocabulary, which has no unknown-token id"):
        vocab.encode("je suis chaud")
    vocab.save(tmp_path / "v.json")
    assert Vocabulary.load(tmp_path / "v.json") == vocab
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["specials"] == {"bos": 0, "eos": 1, "pad": None, "unk": None}
    with pytest.raises(VocabError, match="vocabulary 'specials'"):
        Vocabulary.from_dict({**data, "specials": {"bos": 0}})


def test_the_fixed_layout_writes_what_it_always_wrote():
    vocab = Vocabulary.build(["one two"], "whitespace")
    assert "specials" not in vocab.to_dict() and vocab.ids == FIXED
    assert vocab.sha256 == Vocabulary.from_dict(vocab.to_dict()).sha256


def test_a_declared_spec_holds_only_what_applies():
    spec = ModelSpec(kind="tokens", arch="declared", attention="none", source_vocab_size=7, target_vocab_size=9,
                     input_len=10, target_len=12)
    assert spec.is_declared and ModelSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict() == {"kind": "tokens", "arch": "declared", "source_vocab_size": 7, "target_vocab_size": 9,
                              "input_len": 10, "target_len": 12}  # only what applies: the contract holds the rest
    with pytest.raises(SpecError, match="do not apply to a declared model"):
        ModelSpec(kind="tokens", arch="declared", source_vocab_size=7, target_vocab_size=9, hidden_dim=32)
    with pytest.raises(SpecError, match="do not apply to a declared model"):
        ModelSpec(kind="tokens", arch="declared", source_vocab_size=7, target_vocab_size=9, attention="additive")
    with pytest.raises(SpecError, match="needs kind 'tokens'"):
        ModelSpec(arch="declared", attention="none")


def test_a_subword_vocabulary_with_its_own_special_ids(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["red green blue", "green gold pink"] * 20,
                                  trainers.WordPieceTrainer(vocab_size=60, special_tokens=["[SEP]", "[CLS]", "[UNK]"]))
    tokenizer.save(str(tmp_path / "t.json"))
    ids = Specials(bos=1, eos=0, unk=2)  # [CLS] starts, [SEP] ends, as a BERT-style tokenizer lays them out
    vocab = Vocabulary.from_tokenizer_file(tmp_path / "t.json", ids)
    encoded = vocab.encode("red gold")
    assert encoded[-1] == 0 and 2 not in encoded and vocab.decode(encoded) == "red gold"
    assert Vocabulary.from_dict(vocab.to_dict()) == vocab
    with pytest.raises(VocabError, match="must hold the specials"):
        Vocabulary.from_tokenizer_file(tmp_path / "t.json")  # seq2onnx's own layout: <pad> <s> </s> <unk> first
