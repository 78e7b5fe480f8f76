"""The sandbox layer's commands: fleet setup, images, doctor, sandbox ls / gc."""
