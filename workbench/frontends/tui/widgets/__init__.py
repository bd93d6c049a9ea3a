"""One widget per file, named after what the user sees."""
