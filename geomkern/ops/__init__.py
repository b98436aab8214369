"""One module per op family: public function, its validation, and its torch reference."""
