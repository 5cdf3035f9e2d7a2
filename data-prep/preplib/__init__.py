"""Shared code of the data-prep scripts: checked reading of parallel text (``textio``) and the
sentencepiece + fairseq-preprocess path every data set goes through (``binarize``)."""
