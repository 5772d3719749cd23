"""Transcripts: the schema, the writer and the reader, recorded LLM outputs, and the terminal
text of a transcript. Replay and the reports that read transcripts back are ``market.review``,
above ``market.run``."""
