"""digitsnas: FedorAS on scikit-learn's 8x8 digits, a Flower app of its own."""
