"""Actions as data: each knows how to apply and undo itself; the Plan they form, kernel names, and the write-ahead ledger that records them."""
