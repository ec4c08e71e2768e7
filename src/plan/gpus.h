// GPU memory presets by card name, and byte sizes as users write them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qinfer {

struct GpuPreset {
    const char* name;  // "rtx4070-laptop"
    const char* card;  // "GeForce RTX 4070 Laptop GPU (8 GB)"
    uint64_t bytes;    // total memory of the card
};
const std::vector<GpuPreset>& gpu_presets();
std::optional<uint64_t> gpu_preset_bytes(std::string_view name);  // case-insensitive

// "8GiB", "8G", "7.5 GiB", "8000MB", "512MiB", "8589934592". K/M/G/T and
// KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000. Throws
// Error naming `what` (the flag) on anything else.
uint64_t parse_bytes(std::string_view s, const char* what);

// "2.51 GiB", "178.25 MiB", "32.00 KiB", "512 B".
std::string format_bytes(uint64_t b);

}  // namespace qinfer
