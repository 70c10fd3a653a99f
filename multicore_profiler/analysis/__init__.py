"""Named SQL analyses over the store: record analyses, outer-kernel analyses, comparison."""
