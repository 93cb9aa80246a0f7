from libreyolo_cpp import LibreYOLO, SAMPLE_IMAGE

model = LibreYOLO("LibreYOLO9t.pt")
# Captured on the first use of each input shape.
result = model(SAMPLE_IMAGE, cuda_graph=True)
print(result)
