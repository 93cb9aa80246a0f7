from libreyolo_cpp import LibreYOLO

model = LibreYOLO("LibreYOLO9s.pt")
model.train(data="my-dataset.yaml", amp=True, amp_dtype="bfloat16")
