// placeholder; replaced as the layer is written
namespace qinfer {}
