"""Shared code of the data-prep scripts: checked reading of parallel text (``textio``), the
sentencepiece + fairseq-preprocess path every data set goes through (``binarize``) and the output
folder, built aside and moved into place only when everything succeeded (``output``).

Reading user files (UTF-8 with error locations, byte-order marks, the one-line error exit) follows the
same rules as the scoring scripts: ``sparse_softmax.userinput``.
"""
