"""The ClientApp: every DecNAS message answered by fedorasflwr's client code on this node's
synthetic images."""

from fedorasflwr.clients import make_client_app

from shapesprune.data import NUM_CLASSES, load_data

app = make_client_app(load_data, num_classes=NUM_CLASSES)
