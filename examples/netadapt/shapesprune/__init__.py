"""shapesprune: DecNAS (federated NetAdapt) prunes a small CNN of its own on synthetic
line images, a Flower app of its own."""
