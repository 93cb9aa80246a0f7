from libreyolo_cpp import LibreYOLO

model = LibreYOLO("LibreYOLO9s.pt")
# Profile a short window of real steps, print a verdict, then go on training with the hooks removed.
model.train(data="my-dataset.yaml", epochs=100, profile=True)
