"""A teacher and a student compared token by token (verl_hf/vocabulary.py): tokenizers built locally, no Hub."""

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from verl_hf.vocabulary import shared_vocabulary

SPECIALS = ["<pad>", "</s>", "<s>", "<unk>"]  # ids 0..3


def word_tokenizer(size: int = 100, swap: tuple[str, str] | None = None, eos: str = "</s>",
                   added: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer of `size` tokens: the specials, then w4, w5, ...; `swap` exchanges two tokens' ids."""
    tokens = SPECIALS + [f"w{i}" for i in range(len(SPECIALS), size)]
    vocab = {token: i for i, token in enumerate(tokens)}
    if swap:
        a, b = swap
        vocab[a], vocab[b] = vocab[b], vocab[a]
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token=eos,
                                        bos_token="<s>", unk_token="<unk>")
    tokenizer.add_tokens(list(added))
    return tokenizer


def test_identical_tokenizers_and_rows_share_every_id():
    assert shared_vocabulary(word_tokenizer(), word_tokenizer(), 100, 100) == 100


def test_padding_rows_past_the_tokenizer_are_left_out():
    # 100 tokens; the student has 28 padding rows, the teacher 36: compare ids [0, 128)
    assert shared_vocabulary(word_tokenizer(), word_tokenizer(), 128, 136) == 128
    assert shared_vocabulary(word_tokenizer(), word_tokenizer(), 136, 128) == 128


def test_qwen25_row_counts_share_the_smaller_one():
    # Qwen2.5-0.5B has 151936 rows, Qwen2.5-7B 152064, one tokenizer (here a small stand-in)
    assert shared_vocabulary(word_tokenizer(), word_tokenizer(), 151936, 152064) == 151936


def test_a_tokenizer_longer_than_the_smaller_rows_is_refused():
    # 100 tokens but the student has only 90 rows: ids 90..99 have no student row
    with pytest.raises(ValueError, match=r"ids up to 99 \(100 tokens\) but the models share only 90 embedding rows "
                                         r"\(student 90, teacher 128\): ids 90..99 have no row in the student\."):
        shared_vocabulary(word_tokenizer(), word_tokenizer(), 90, 128)


def test_an_added_token_past_the_rows_is_refused():
    tokenizer = word_tokenizer(added=("<tool>",))  # id 100, and both models have 100 rows
    with pytest.raises(ValueError, match=r"resize_token_embeddings\(101\)"):
        shared_vocabulary(tokenizer, word_tokenizer(added=("<tool>",)), 100, 100)


def test_two_swapped_ids_are_refused_naming_the_token():
    teacher = word_tokenizer(swap=("w10", "w11"))
    with pytest.raises(ValueError, match=r"token 'w10' is id 10 for the student and 11 for the teacher; "
                                         r"token 'w11' is id 11 for the student and 10 for the teacher\. "
                                         r".*TRL issue #4562\). Fix: use a teacher of the same tokenizer family"):
        shared_vocabulary(word_tokenizer(), teacher, 128, 128)


def test_a_teacher_with_an_extra_token_is_refused():
    teacher = word_tokenizer(added=("<think>",))
    with pytest.raises(ValueError, match=r"token '<think>' \(id 100\) exists for the Qwen/Qwen2.5-7B only"):
        shared_vocabulary(word_tokenizer(), teacher, 128, 128, teacher_name="Qwen/Qwen2.5-7B")


def test_many_differences_are_counted_not_all_listed():
    teacher = word_tokenizer(size=90)  # ten fewer tokens: w90..w99 exist for the student only
    with pytest.raises(ValueError, match=r"10 differing\): token 'w90' \(id 90\) exists for the student only; .*"
                                         r"; and 7 more\."):
        shared_vocabulary(word_tokenizer(), teacher, 128, 128)


def test_a_different_eos_is_refused_naming_eos():
    teacher = word_tokenizer(eos="<pad>")
    with pytest.raises(ValueError, match=r"eos_token_id differs: 1 \('</s>'\) for the student, 0 \('<pad>'\) for "
                                         r"the teacher.*set the teacher tokenizer's eos_token to the student's"):
        shared_vocabulary(word_tokenizer(), teacher, 128, 128)


def test_chat_templates_are_not_compared():
    student, teacher = word_tokenizer(), word_tokenizer()
    student.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert shared_vocabulary(student, teacher, 100, 100) == 100


def test_a_row_count_that_is_not_a_positive_int_is_refused():
    with pytest.raises(ValueError, match=r"the teacher's vocab size \(embedding rows\) is 0; pass a positive int"):
        shared_vocabulary(word_tokenizer(), word_tokenizer(), 100, 0)
