"""Text input for the BERT-family models: a WordPiece tokenizer and an embedded sentence corpus."""

from .corpus import python_reference_sentences
from .tokenizer import Encoding, WordPieceTokenizer, locate_minilm

__all__ = ["Encoding", "WordPieceTokenizer", "locate_minilm", "python_reference_sentences"]
