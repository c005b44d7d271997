"""Wire codecs with no I/O: S2S frames and ReadBatch decoding to Arrow."""
