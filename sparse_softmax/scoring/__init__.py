"""Scoring library behind ``scripts/score_summaries.py`` and ``scripts/score_questions.py``.

Plain Python (no torch, no fairseq), so scoring starts in a second and runs anywhere:
``inputs`` reads and checks hypothesis/reference files (plain text or fairseq-generate output),
``bleu`` is corpus BLEU as the coco/qgevalcap scorer computes it, ``rouge`` wraps rouge-score and adds
coco's ROUGE-L, ``report`` does bootstrap intervals, the printed table and the JSON.
"""
